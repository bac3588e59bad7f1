package natsbus

import (
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser never panics, and its errors never show
// the password or token, whatever the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	fuzztest.Seed(f, Scheme)
	f.Add(Scheme, uint8(2), "alice", "pw", "", "embedded?dir=/x", false)
	f.Add(Scheme, uint8(2), "", "to", "ken", "h1:1,h2?partitions=-1&lease_ttl=1ms", true)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := fuzztest.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := fuzztest.Parse(raw)
		if !ok {
			return
		}
		cfg, err := parseURL(u)
		if err != nil {
			fuzztest.Check(t, "parseURL", raw, err.Error())
			return
		}
		fuzztest.Check(t, "the redacted URL", raw, cfg.redacted)
		fuzztest.Check(t, "credentials", raw, cfg.credentials())
	})
}
