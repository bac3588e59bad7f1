package redact_test

import (
	"fmt"
	"testing"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// FuzzRedact: for a URL of any shape whose password or token holds
// fuzztest.Marker, URL hides it, and Text hides it in a message that
// quotes the URL as is and Go-quoted. (What a client library given the
// parsed URL prints is the root package's FuzzOpen: only URLs that Open
// accepts reach one.)
func FuzzRedact(f *testing.F) {
	fuzztest.Seed(f, "amqp", "nats", "kafka+x", "1bad", "")
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := fuzztest.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		fuzztest.Check(t, "URL", raw, redact.URL(raw))
		fuzztest.Check(t, "Text", raw, redact.Text(fmt.Sprintf("dial %s: %q", raw, raw), raw))
	})
}
