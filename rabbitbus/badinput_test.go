package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

func TestOpenErrors(t *testing.T) {
	requireServer(t)
	const secret = "s3cr3t-pa55"
	host := strings.TrimPrefix(testURL, "amqp://guest:guest@")
	tests := []struct {
		name   string
		url    string
		want   string // in the message
		target error  // errors.Is, when set
	}{
		{"wrong password", "amqp://guest:" + secret + "@" + host, "authentication failed for user \"guest\"", nil},
		{"unknown user", "amqp://nobody:" + secret + "@" + host, "authentication failed for user \"nobody\"", nil},
		{"missing vhost", "amqp://guest:guest@" + strings.TrimSuffix(host, "/") + "/no-such-vhost-" + secret, "virtual host \"no-such-vhost-", omnibus.ErrNotFound},
		{"unknown parameter", "amqp://guest:" + secret + "@" + host + "?prefetch=10", "unknown parameter prefetch", omnibus.ErrInvalid},
		{"bad queue type", testURL + "?queue_type=stream", "queue_type=\"stream\"", omnibus.ErrInvalid},
		{"tls option without amqps", testURL + "?tls_insecure=true", "needs the amqps scheme", omnibus.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := omnibus.Open(ctx, tt.url)
			if err == nil {
				_ = c.Close()
				t.Fatalf("Open(%q) succeeded, want an error", tt.url)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not say %q", msg, tt.want)
			}
			if tt.name != "missing vhost" && strings.Contains(msg, secret) {
				t.Errorf("error shows the password: %q", msg)
			}
			if tt.target != nil && !errors.Is(err, tt.target) {
				t.Errorf("error %q does not wrap %v", msg, tt.target)
			}
		})
	}
}

// TestPublishTooLarge checks that a message over the limit fails alone:
// through the portable layer, through the driver, and when the server
// itself refuses it (the limit the client knows set above the server's).
func TestPublishTooLarge(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := fmt.Sprintf("omnibus-toolarge-%x", rand.Uint32())

	t.Run("client limit", func(t *testing.T) {
		c := open(ctx, t, "max_message_bytes=1000")
		err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("a")}, &omnibus.Message{Body: make([]byte, 1001)}, &omnibus.Message{Body: []byte("c")})
		var pe *omnibus.PublishError
		if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrTooLarge) {
			t.Fatalf("got %v, want a *PublishError with only message 1 failing with ErrTooLarge", err)
		}
		// The driver checks too, for callers of the driver itself.
		dc := c.Driver()
		err = dc.Publish(ctx, topic, []*driver.Message{{ID: "a"}, {ID: "b", Body: make([]byte, 1001)}}, driver.PublishOptions{})
		var be *driver.MessageErrors
		if !errors.As(err, &be) || be.Errs[0] != nil || !errors.Is(be.Errs[1], driver.ErrTooLarge) {
			t.Fatalf("driver Publish: got %v, want a *BatchError failing only message b with ErrTooLarge", err)
		}
	})

	t.Run("server limit", func(t *testing.T) {
		if testing.Short() {
			t.Skip("SKIP (-short): sends a 128 MiB message")
		}
		c := open(ctx, t, fmt.Sprintf("max_message_bytes=%d", 1<<30))
		k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("big"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Close() })
		big := &omnibus.Message{ID: "big", Body: make([]byte, DefaultMaxMessageBytes+1)}
		err = c.Publish(ctx, topic, &omnibus.Message{ID: "small1", Body: []byte("a")}, big, &omnibus.Message{ID: "small2", Body: []byte("c")})
		var pe *omnibus.PublishError
		if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].ID != "big" || !errors.Is(err, omnibus.ErrTooLarge) {
			t.Fatalf("got %v, want a *PublishError with only %q failing with ErrTooLarge", err, "big")
		}
		t.Logf("server refusal reported as: %v", pe.Failed[0].Err)
		// The client now knows the server's limit.
		err = c.Publish(ctx, topic, big)
		if !errors.Is(err, omnibus.ErrTooLarge) {
			t.Fatalf("second oversized publish: got %v, want ErrTooLarge", err)
		}
		if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("after")}); err != nil {
			t.Fatalf("publish after the refusal: %v", err)
		}
	})
}

// TestPublishRefusesHeadersThatWouldNotArrive: a header with RabbitMQ's
// x- prefix, or named as one of rabbitbus's own, fails its message with
// ErrInvalid (a receiver would not get it back); the others of the batch
// are published.
func TestPublishRefusesHeadersThatWouldNotArrive(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := open(ctx, t, "")
	topic := fmt.Sprintf("omnibus-headers-%x", rand.Uint32())
	for _, name := range []string{"x-request-id", "x-death", hdrAttempt, hdrKey, hdrKeyless} {
		err := c.Publish(ctx, topic, &omnibus.Message{Headers: map[string]string{"X-Request-Id": "kept"}},
			&omnibus.Message{Headers: map[string]string{name: "v"}})
		var pe *omnibus.PublishError
		if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("header %q: got %v, want a *PublishError failing message 1 alone with ErrInvalid naming it", name, err)
		}
	}
}

// TestMandatory checks that an unroutable message fails alone with
// ErrUnroutable when mandatory=true.
func TestMandatory(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := open(ctx, t, "mandatory=true")
	topic := fmt.Sprintf("omnibus-mandatory-%x", rand.Uint32())
	err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("nobody listens")})
	if !errors.Is(err, ErrUnroutable) || !errors.Is(err, omnibus.ErrNotFound) {
		t.Fatalf("publish to a topic without groups: got %v, want ErrUnroutable", err)
	}
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("routed")}); err != nil {
		t.Fatalf("publish with a group bound: %v", err)
	}
}

// TestQuorum runs a round trip with retries on quorum queues, whose
// redelivery count comes from x-delivery-count.
func TestQuorum(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := open(ctx, t, "queue_type=quorum")
	topic := fmt.Sprintf("omnibus-quorum-%x", rand.Uint32())
	attempts := make(chan int, 10)
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		attempts <- m.Attempt
		if m.Attempt < 3 {
			return errors.New("again")
		}
		return nil
	}, omnibus.Group("q"), omnibus.Backoff(10*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("q")}); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		select {
		case got := <-attempts:
			if got != want {
				t.Fatalf("attempt %d, want %d", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("attempt %d never came", want)
		}
	}
}
