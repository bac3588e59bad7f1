package natsbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
)

// TestHostlessURLsAreRefused: a URL whose host is missing (one slash,
// none, three, an empty host list) or swallowed by an unescaped "/" in
// a token is an error that names the problem and hides the token, from
// omnibus.Open and from the driver itself, and never a client of the
// local server: nothing reaches the machine's NATS, where such a URL
// used to publish.
func TestHostlessURLsAreRefused(t *testing.T) {
	server := externalURL(t) // where a misrouted URL would land
	const secret = "S3cretTOKEN"
	urls := []string{
		"nats:/127.0.0.2:4999",
		"nats:127.0.0.2:4999",
		"nats:" + secret + "@127.0.0.2:4999",
		"nats:/" + secret + "@127.0.0.2:4999",
		"nats:///127.0.0.2:4999",
		"nats:///" + secret + "@127.0.0.2:4999",
		"nats://",
		"nats://,",
		"nats://" + secret + "/x@127.0.0.2:4999",
		"nats://" + secret + "@/x",
	}
	opens := map[string]func(ctx context.Context, raw string) (func(topic string) error, error){
		"omnibus.Open": func(ctx context.Context, raw string) (func(string) error, error) {
			c, err := omnibus.Open(ctx, raw)
			if err != nil {
				return nil, err
			}
			return func(topic string) error {
				defer c.Close()
				return c.Publish(ctx, topic, &omnibus.Message{Body: []byte("misrouted")})
			}, nil
		},
		"driver": func(ctx context.Context, raw string) (func(string) error, error) {
			c, _, err := natsbus.OpenConn(ctx, raw)
			if err != nil {
				return nil, err
			}
			return func(string) error { return c.Close() }, nil
		},
	}
	for _, raw := range urls {
		for name, open := range opens {
			t.Run(name+"/"+raw, func(t *testing.T) {
				topic := topicName(t, server)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				publish, err := open(ctx, raw)
				if err == nil {
					t.Errorf("Open(%q) succeeded, want an error; published: %v", raw, publish(topic))
				} else {
					if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "host") && !strings.Contains(err.Error(), "path") {
						t.Errorf("Open(%q) = %v, want ErrInvalid naming the missing host", raw, err)
					}
					if strings.Contains(err.Error(), secret) {
						t.Errorf("Open(%q) shows the token: %v", raw, err)
					}
					if took := time.Since(start); took > time.Second {
						t.Errorf("Open(%q) took %v to refuse: it tried to connect", raw, took)
					}
				}
				if s := streamOfSubject(t, server, topic); s != "" {
					t.Errorf("the local server has stream %q for topic %q: the URL published there", s, topic)
				}
			})
		}
	}
}

// streamOfSubject returns the stream of the server holding subject, or "".
func streamOfSubject(t testing.TB, serverURL, subject string) string {
	t.Helper()
	nc, err := nats.Connect(serverURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, subject)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
	return name
}
