package driver

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/omnibus-go/omnibus/internal/redact"
)

// PortableParams are the URL query parameters package omnibus reads for
// every transport and removes before calling Driver.Open.
//
//	durability  none | leader | all (default all): see Durability.
var PortableParams = []string{"durability"}

// CheckParams returns an error wrapping ErrInvalid that names every query
// parameter of u not in known, and lists the known ones. Drivers call it
// first thing in Open, so a typo is an error rather than a silent default.
// Like omnibus.Open, it refuses an "@" in the query or the fragment:
// there it follows a "?" or "#" typed in a password or token, whose
// rest would read as parameters (and show in this error).
func CheckParams(u *url.URL, known ...string) error {
	if strings.Contains(u.RawQuery, "@") || strings.Contains(u.EscapedFragment(), "@") {
		return fmt.Errorf("URL %q has an \"@\" after its host: write a \"?\" or \"#\" in a password or token as %%3F or %%23, and an \"@\" elsewhere as %%40: %w",
			redact.URL(u.String()), ErrInvalid)
	}
	var unknown []string
	for k := range u.Query() {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	all := append(slices.Clone(known), PortableParams...)
	slices.Sort(all)
	return fmt.Errorf("URL %q: unknown parameter %s (known: %s): %w",
		redact.URL(u.String()), strings.Join(unknown, ", "), strings.Join(all, ", "), ErrInvalid)
}
