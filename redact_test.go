package omnibus_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// quoting is a driver whose errors quote the URL it was given, its password
// and its user name, decoded, as a careless client library would. It
// counts the URLs without a host part it was given.
type quoting struct{}

var quotingOpaque atomic.Int64

func (quoting) Open(_ context.Context, u *url.URL, _ driver.OpenOptions) (driver.Conn, error) {
	if u.Opaque != "" || u.OmitHost {
		quotingOpaque.Add(1)
	}
	pass, _ := u.User.Password()
	return nil, fmt.Errorf("dial %s failed (user %s, password %s, raw %s)", u, u.User.Username(), pass, u.User.String())
}

func init() { omnibus.Register("quoting", quoting{}) }

// secretShapes are secrets as a user might type them: plain, with the
// characters a URL gives meaning to, escaped, not ASCII.
var secretShapes = []string{
	"S3cretTOKEN",
	"p@ss/w?rd#1x",
	"pa%40ss%2Fword",
	"pa ss word",
	"tøken✓secret",
	"a:b:c-secret",
	"dG9rZW4/K+Lw==",
	"semi;colon&amp=eq",
}

// urlShapes put a secret (SECRET) and a user name (USER) into URLs of
// odd shapes: host-less, opaque, schemeless, malformed, with queries and
// fragments, with several hosts.
var urlShapes = []string{
	"quoting://USER:SECRET@127.0.0.1:1/",
	"quoting://SECRET@127.0.0.1:1",
	"quoting://:SECRET@127.0.0.1:1",
	"quoting:/USER:SECRET@127.0.0.1:1/",
	"quoting:USER:SECRET@127.0.0.1:1/",
	"quoting:SECRET@127.0.0.1:1",
	"quoting:/SECRET@127.0.0.1:1",
	"quoting:///USER:SECRET@127.0.0.1:1",
	"quoting:////SECRET@127.0.0.1:1",
	"quoting://USER:SECRET@h1:1,h2:2/vhost?durability=all&x=1",
	"quoting://USER:SECRET@local host:1",
	"quoting://USER:SECRET@127.0.0.1:port",
	"quoting://USER:SECRET@[::1",
	"quoting://USER:SECRET@127.0.0.1:1?name=a@b",
	"quoting://SECRET@127.0.0.1:1#frag@x",
	"quoting://USER:SECRET@127.0.0.1:1/a@b",
	"quoting://USER:SECRET@127.0.0.1:1?durability=most",
	"quoting://USER:SECRET@127.0.0.1:1\n",
	"quoting://USER:SECRET@\x7f",
	"ECHO://USER:SECRET@127.0.0.1:1",
	"USER:SECRET@127.0.0.1:1",
	"//USER:SECRET@127.0.0.1:1",
	" quoting://USER:SECRET@127.0.0.1:1",
	"quoting://SECRET:@127.0.0.1:1",
	// A credential in a query parameter: no transport reads one, but a
	// user may write one, and the error that refuses it must not show it.
	"quoting://127.0.0.1:1?password=SECRET",
	"quoting://USER:SECRET@127.0.0.1:1/?durability=all&Access_Token=SECRET#f",
	"quoting://127.0.0.1:1?x=1;secret_key=SECRET",
	"quoting:127.0.0.1:1?auth=SECRET",
}

// secretForms are the ways secret can show: as typed, decoded, escaped.
func secretForms(secret string) []string {
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret)}
	if dec, err := url.PathUnescape(secret); err == nil {
		forms = append(forms, dec)
	}
	if dec, err := url.QueryUnescape(secret); err == nil {
		forms = append(forms, dec)
	}
	return forms
}

func checkHidden(t *testing.T, what, got, secret string) {
	t.Helper()
	for _, f := range secretForms(secret) {
		if strings.Contains(got, f) {
			t.Errorf("%s shows the secret %q (as %q):\n%s", what, secret, f, got)
		}
	}
}

// TestRedactHidesEverySecret: whatever the URL's shape, its secret shows
// neither in RedactURL, nor in a message redacted with Redact, nor in
// Open's error, even from a driver that quotes it; and a URL without a
// host part never reaches the driver.
func TestRedactHidesEverySecret(t *testing.T) {
	for _, shape := range urlShapes {
		for _, secret := range secretShapes {
			for _, user := range []string{"alice", "TOKENUSER"} {
				if strings.Contains(shape, "SECRET:@") && strings.Contains(secret, ":") {
					continue // the URL's own reading: user "a", password "b:c...:"
				}
				raw := strings.NewReplacer("USER", user, "SECRET", secret).Replace(shape)
				t.Run(fmt.Sprintf("%q", raw), func(t *testing.T) {
					checkHidden(t, "RedactURL", omnibus.RedactURL(raw), secret)
					msg := "client: cannot reach " + raw + " with password " + secret + " (" + url.QueryEscape(secret) + ")"
					checkHidden(t, "Redact", omnibus.Redact(msg, raw), secret)

					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					c, err := omnibus.Open(ctx, raw)
					if err == nil {
						c.Close()
						t.Fatalf("Open(%q) succeeded, want an error", raw)
					}
					checkHidden(t, "Open's error", err.Error(), secret)
				})
			}
		}
	}
	if n := quotingOpaque.Load(); n != 0 {
		t.Errorf("%d URLs without a host part reached the driver", n)
	}
}

// TestRedactURLShapes pins what a reader sees.
func TestRedactURLShapes(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"nats://S3cretTOKEN@127.0.0.1:4999", "nats://xxxxx@127.0.0.1:4999"},
		{"amqp://alice:pw@h:5672/vh?x=1", "amqp://alice:xxxxx@h:5672/vh?x=1"},
		{"amqp:/alice:S3cretPW@127.0.0.2:5999/", "amqp:/alice:xxxxx@127.0.0.2:5999/"},
		{"amqp:guest:guest@127.0.0.2:5999/", "amqp:guest:xxxxx@127.0.0.2:5999/"},
		{"kafka:/alice:pw@h", "kafka:/alice:xxxxx@h"},
		{"nats://tok/en@h:1", "nats://xxxxx@h:1"},
		{"nats://u:p@ss@h", "nats://u:xxxxx@h"},
		{"nats://h:4222", "nats://h:4222"},
		{"mem://", "mem://"},
		{"nats://embedded?dir=/tmp/x", "nats://embedded?dir=/tmp/x"},
		{"redis://h:1?password=pw&db=2", "redis://h:1?password=xxxxx&db=2"},
		{"kafka://u:pw@h?sasl=plain&SASL%5FPASSWORD=pw#x", "kafka://u:xxxxx@h?sasl=plain&SASL%5FPASSWORD=xxxxx#x"},
		{"kinesis://us-east-1?secret=&api_key=k1&key_id=k2", "kinesis://us-east-1?secret=&api_key=xxxxx&key_id=k2"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := omnibus.RedactURL(tt.raw); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

// TestRedactShortSecret: a short password is hidden where it stands,
// and the words that contain its letters are left alone.
func TestRedactShortSecret(t *testing.T) {
	raw := "nats://u:p@127.0.0.1:1"
	msg := "open " + raw + ": password p refused (p)"
	want := "open nats://u:xxxxx@127.0.0.1:1: password xxxxx refused (xxxxx)"
	if got := omnibus.Redact(msg, raw); got != want {
		t.Errorf("Redact(%q) = %q, want %q", msg, got, want)
	}
}

// TestOpenRefusesHostlessURLs: a URL whose host part is missing (one
// slash, or none) is an error naming the problem, before any driver runs.
func TestOpenRefusesHostlessURLs(t *testing.T) {
	for _, raw := range []string{"quoting:/127.0.0.2:4999", "quoting:guest:guest@127.0.0.2:5999/", "quoting:/alice:pw@h", "quoting:h", "mem:/x", "mem:x"} {
		c, err := omnibus.Open(context.Background(), raw)
		if err == nil {
			c.Close()
			t.Fatalf("Open(%q) succeeded", raw)
		}
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "has no host") {
			t.Errorf("Open(%q) = %v, want ErrInvalid saying it has no host", raw, err)
		}
		if quotingOpaque.Load() != 0 {
			t.Fatalf("Open(%q) reached the driver", raw)
		}
	}
}

// TestOpenErrorKeepsTheCause: redacting a driver's error keeps it
// reachable with errors.Is.
func TestOpenErrorKeepsTheCause(t *testing.T) {
	_, err := omnibus.Open(context.Background(), "mem://u:S3cret@bus?partitions=-2")
	if !errors.Is(err, omnibus.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	checkHidden(t, "Open's error", err.Error(), "S3cret")
}
