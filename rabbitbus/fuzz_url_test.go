package rabbitbus

import (
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser (amqp091-go's ParseURI included) never
// panics, and its errors never show the password, nor a user name
// given without one, whatever the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	fuzztest.Seed(f, Scheme, SchemeTLS)
	f.Add(Scheme, uint8(2), "guest", "pw", "", "h:1/%2F?partitions=2000", false)
	f.Add(SchemeTLS, uint8(2), "", "to", "ken", "h:99999/v@host?tls_insecure=maybe", true)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := fuzztest.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := fuzztest.Parse(raw, "tls_ca", "tls_cert", "tls_key")
		if !ok {
			return
		}
		cfg, err := parseConfig(u)
		if err != nil {
			fuzztest.Check(t, "parseConfig", raw, err.Error())
			return
		}
		fuzztest.Check(t, "the redacted URL", raw, cfg.redacted)
		fuzztest.Check(t, "who", raw, cfg.who())
	})
}
