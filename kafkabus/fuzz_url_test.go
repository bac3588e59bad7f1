package kafkabus

import (
	"net/url"
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzParseURL: the URL parser never panics, and neither its errors nor
// the redacted URL show the password, whatever the URL (see fuzztest).
func FuzzParseURL(f *testing.F) {
	f.Add(Scheme, uint8(2), "alice", "pw", "", "h:1?mechanism=SCRAM-SHA-9&tls_server_name=x", false)
	f.Add(SchemeTLS, uint8(2), "alice", "p", "w", "h:1,,h2:2?partitions=0", false)
	fuzztest.ParserTarget(f, []string{Scheme, SchemeTLS}, []string{"tls_ca", "tls_cert", "tls_key"}, func(u *url.URL) ([]string, error) {
		cfg, err := parseURL(u)
		if err != nil {
			return nil, err
		}
		_, err = cfg.clientOpts()
		return []string{cfg.redacted}, err
	})
}
