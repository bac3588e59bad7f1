package kafkabus

import (
	"testing"

	"github.com/omnibus-go/omnibus/internal/secretfuzz"
)

// FuzzParseURL: the URL parser never panics, and its errors never show
// the password, whatever the URL (see secretfuzz).
func FuzzParseURL(f *testing.F) {
	secretfuzz.Seed(f, Scheme, SchemeTLS)
	f.Add(Scheme, uint8(2), "alice", "pw", "", "h:1?mechanism=SCRAM-SHA-9&tls_server_name=x", false)
	f.Add(SchemeTLS, uint8(2), "alice", "p", "w", "h:1,,h2:2?partitions=0", false)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := secretfuzz.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := secretfuzz.Parse(raw, "tls_ca", "tls_cert", "tls_key")
		if !ok {
			return
		}
		cfg, err := parseURL(u)
		if err != nil {
			secretfuzz.Check(t, "parseURL", raw, err.Error())
			return
		}
		secretfuzz.Check(t, "the redacted URL", raw, cfg.redacted)
		if _, err := cfg.clientOpts(); err != nil {
			secretfuzz.Check(t, "clientOpts", raw, err.Error())
		}
	})
}
