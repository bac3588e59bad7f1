package omnibus_test

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzOpen: whatever the URL, and whatever the driver says about the URL
// it is given (the quoting driver quotes the URL, its user info, the user
// name and the password, decoded, as a careless client library would),
// neither Open's error nor RedactURL shows a password or token.
func FuzzOpen(f *testing.F) {
	fuzztest.Seed(f, "quoting", "mem", "unknown", "QUOTING", "")
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := fuzztest.URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		fuzztest.Check(t, "RedactURL", raw, omnibus.RedactURL(raw))
		for _, opts := range [][]omnibus.Option{nil, {omnibus.WithDriver(quoting{})}} {
			c, err := omnibus.Open(context.Background(), raw, opts...)
			if err == nil {
				fuzztest.Check(t, "String", raw, c.String())
				_ = c.Close()
				continue
			}
			fuzztest.Check(t, "Open", raw, err.Error())
		}
	})
}
