package natsbus

import (
	"net/url"
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser never panics, and neither its errors nor
// the redacted URL and the names of the credentials show the password
// or token, whatever the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	f.Add(Scheme, uint8(2), "alice", "pw", "", "embedded?dir=/x", false)
	f.Add(Scheme, uint8(2), "", "to", "ken", "h1:1,h2?partitions=-1&lease_ttl=1ms", true)
	fuzztest.ParserTarget(f, []string{Scheme}, nil, func(u *url.URL) ([]string, error) {
		cfg, err := parseURL(u)
		if err != nil {
			return nil, err
		}
		return []string{cfg.redacted, cfg.credentials()}, nil
	})
}
