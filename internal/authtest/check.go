// Package authtest is what the transports' TLS and authentication tests
// share: certificates made by the test (certs.go), and the two checks
// (this file): a client given the right CA and credentials works end to
// end; one given a wrong CA, server name or password is refused fast,
// with an error that says why and does not show the password. Only
// tests import it.
package authtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Bound is how soon a refused Open must fail. It is far below the
// transports' connect timeouts and the test's context, so a refusal
// that is only noticed when something times out fails the check.
const Bound = 5 * time.Second

// Works opens rawURL with opts and checks the client end to end: a
// message published after a group subscribed reaches the group's
// handler. It returns the client, closed at cleanup.
func Works(t testing.TB, rawURL string, opts ...omnibus.Option) *omnibus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, rawURL, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", omnibus.RedactURL(rawURL), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	topic := fmt.Sprintf("authtest-%x", rand.Uint32())
	if err := c.CreateTopic(ctx, topic, 1); err != nil && !errors.Is(err, omnibus.ErrUnsupported) {
		t.Fatalf("CreateTopic(%q): %v", topic, err)
	}
	type received struct{ id, body string }
	got := make(chan received, 1)
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		select {
		case got <- received{m.ID, string(m.Body)}:
		default:
		}
		return nil
	}, omnibus.Group("authtest"))
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", topic, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	sent := &omnibus.Message{Key: "k", Body: []byte("over TLS")}
	if err := c.Publish(ctx, topic, sent); err != nil {
		t.Fatalf("Publish(%q): %v", topic, err)
	}
	select {
	case m := <-got:
		if m.id != sent.ID || m.body != string(sent.Body) {
			t.Errorf("received %s %q, want %s %q", m.id, m.body, sent.ID, sent.Body)
		}
	case <-ctx.Done():
		t.Fatalf("the message published to %q did not arrive: %v", topic, ctx.Err())
	}
	return c
}

// Refused opens rawURL with opts and checks that it fails within Bound,
// with an error that contains each of want (in any case) and does not
// contain secret. It returns the error for further checks.
func Refused(t testing.TB, rawURL, secret string, want []string, opts ...omnibus.Option) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := omnibus.Open(ctx, rawURL, opts...)
	took := time.Since(start)
	if err == nil {
		_ = c.Close()
		t.Fatalf("Open(%s) succeeded, want it refused", omnibus.RedactURL(rawURL))
	}
	t.Logf("refused in %v: %v", took.Round(time.Millisecond), err)
	if took > Bound {
		t.Errorf("Open took %v to fail, want at most %v: %v", took, Bound, err)
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(strings.ToLower(msg), strings.ToLower(w)) {
			t.Errorf("Open error does not say %q: %v", w, err)
		}
	}
	if secret != "" && strings.Contains(msg, secret) {
		t.Errorf("Open error shows the password: %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Open error is a timeout, want the refusal: %v", err)
	}
	return err
}
