package rabbitbus

import (
	"net/url"
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser (amqp091-go's ParseURI included) never
// panics, and neither its errors nor the redacted URL and the user it
// names show the password, nor a user name given without one, whatever
// the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	f.Add(Scheme, uint8(2), "guest", "pw", "", "h:1/%2F?partitions=2000", false)
	f.Add(SchemeTLS, uint8(2), "", "to", "ken", "h:99999/v@host?tls_insecure=maybe", true)
	fuzztest.ParserTarget(f, []string{Scheme, SchemeTLS}, []string{"tls_ca", "tls_cert", "tls_key"}, func(u *url.URL) ([]string, error) {
		cfg, err := parseConfig(u)
		if err != nil {
			return nil, err
		}
		return []string{cfg.redacted, cfg.who()}, nil
	})
}
