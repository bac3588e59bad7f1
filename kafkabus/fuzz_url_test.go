package kafkabus

import (
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser never panics, and its errors never show
// the password, whatever the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	fuzztest.Seed(f, Scheme, SchemeTLS)
	f.Add(Scheme, uint8(2), "alice", "pw", "", "h:1?mechanism=SCRAM-SHA-9&tls_server_name=x", false)
	f.Add(SchemeTLS, uint8(2), "alice", "p", "w", "h:1,,h2:2?partitions=0", false)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := fuzztest.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := fuzztest.Parse(raw, "tls_ca", "tls_cert", "tls_key")
		if !ok {
			return
		}
		cfg, err := parseURL(u)
		if err != nil {
			fuzztest.Check(t, "parseURL", raw, err.Error())
			return
		}
		fuzztest.Check(t, "the redacted URL", raw, cfg.redacted)
		if _, err := cfg.clientOpts(); err != nil {
			fuzztest.Check(t, "clientOpts", raw, err.Error())
		}
	})
}
