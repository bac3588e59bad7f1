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
func CheckParams(u *url.URL, known ...string) error {
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
