package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// TestHostlessURLsAreRefused: a URL whose host is missing (one slash,
// none, three) or swallowed by an unescaped "/" in a password is an
// error that names the problem and hides the password, from omnibus.Open
// and from the driver itself, before any connection: amqp091 would
// otherwise dial localhost as guest and publish there.
func TestHostlessURLsAreRefused(t *testing.T) {
	requireServer(t) // where a misrouted URL would land
	const secret = "S3cretPW"
	urls := []string{
		"amqp:/alice:" + secret + "@127.0.0.2:5999/",
		"amqp:guest:guest@127.0.0.2:5999/",
		"amqp:alice:" + secret + "@127.0.0.2:5999/",
		"amqp:/127.0.0.2:5999/",
		"amqp:///",
		"amqp:///alice:" + secret + "@127.0.0.2:5999",
		"amqp://",
		"amqp://guest:gu/" + secret + "@127.0.0.1:5672/",
		"amqp://guest/" + secret + "@127.0.0.1:5672/",
		"amqps:/alice:" + secret + "@127.0.0.2:5999/",
	}
	opens := map[string]func(ctx context.Context, raw string) (driver.Conn, error){
		"omnibus.Open": func(ctx context.Context, raw string) (driver.Conn, error) {
			c, err := omnibus.Open(ctx, raw)
			if err != nil {
				return nil, err
			}
			return c.Driver(), nil
		},
		"driver": func(ctx context.Context, raw string) (driver.Conn, error) {
			u, err := url.Parse(raw)
			if err != nil {
				return nil, errUnparsed
			}
			return Driver{}.Open(ctx, u, driver.OpenOptions{Logger: slog.Default()})
		},
	}
	for _, raw := range urls {
		for name, open := range opens {
			t.Run(name+"/"+raw, func(t *testing.T) {
				topic := fmt.Sprintf("omnibus-misrouted-%x", rand.Uint32())
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				dc, err := open(ctx, raw)
				if errors.Is(err, errUnparsed) {
					return
				}
				if err == nil {
					perr := dc.Publish(ctx, topic, []*driver.Message{{ID: "misrouted"}}, driver.PublishOptions{})
					_ = dc.Close()
					t.Cleanup(func() { deleteTopology(t, []string{"x:" + topic}) })
					t.Fatalf("Open(%q) succeeded, want an error; published: %v", raw, perr)
				}
				if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "host") {
					t.Errorf("Open(%q) = %v, want ErrInvalid naming the host", raw, err)
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("Open(%q) shows the password: %v", raw, err)
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("Open(%q) took %v to refuse: it tried to connect", raw, took)
				}
			})
		}
	}
}

// errUnparsed: url.Parse rejects the URL, so no driver can be handed it.
var errUnparsed = errors.New("url.Parse rejects it")

// TestUserNameAloneIsHidden: a URL whose user info has no password may
// carry a token where the user name goes: it shows in no error.
func TestUserNameAloneIsHidden(t *testing.T) {
	requireServer(t)
	const token = "T0kenAlone"
	host := strings.TrimPrefix(testURL, "amqp://guest:guest@")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, "amqp://"+token+"@"+host)
	if err == nil {
		_ = c.Close()
		t.Fatal("Open succeeded with a user the server does not know")
	}
	if strings.Contains(err.Error(), token) || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("Open = %v, want an authentication failure that does not show %q", err, token)
	}
}
