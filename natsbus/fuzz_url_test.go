package natsbus

import (
	"testing"

	"github.com/omnibus-go/omnibus/internal/secretfuzz"
)

// FuzzParseURL: the URL parser never panics, and its errors never show
// the password or token, whatever the URL (see secretfuzz).
func FuzzParseURL(f *testing.F) {
	secretfuzz.Seed(f, Scheme)
	f.Add(Scheme, uint8(2), "alice", "pw", "", "embedded?dir=/x", false)
	f.Add(Scheme, uint8(2), "", "to", "ken", "h1:1,h2?partitions=-1&lease_ttl=1ms", true)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := secretfuzz.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := secretfuzz.Parse(raw)
		if !ok {
			return
		}
		cfg, err := parseURL(u)
		if err != nil {
			secretfuzz.Check(t, "parseURL", raw, err.Error())
			return
		}
		secretfuzz.Check(t, "the redacted URL", raw, cfg.redacted)
		secretfuzz.Check(t, "credentials", raw, cfg.credentials())
	})
}
