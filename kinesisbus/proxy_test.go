package kinesisbus_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestProxyFreezesForGood: the proxy the frozen tests run through does
// what they count on. Frozen, it forwards nothing; thawed, it forwards on
// the connections opened since, and never again on those that were open
// while it was frozen (a lost path stays lost). So a member that waits
// on a silent connection instead of giving it up never catches up in
// TestFrozenConnections, and a Publish that does never returns in
// TestFrozenPublish.
func TestProxyFreezesForGood(t *testing.T) {
	p := newProxy(t, testenv.EchoServer(t))
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// echoes writes s on c and reports whether anything came back
	// within limit (on a connection that answers again, the bytes held
	// while frozen come first).
	echoes := func(c net.Conn, s string, limit time.Duration) bool {
		t.Helper()
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(limit))
		got := make([]byte, 64)
		n, err := c.Read(got)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("read: %v", err)
		}
		return n > 0
	}
	const silence = 300 * time.Millisecond

	before := dial()
	if !echoes(before, "a", 5*time.Second) {
		t.Fatal("no echo through the proxy before the freeze")
	}
	p.Freeze()
	during := dial()
	if echoes(before, "b", silence) || echoes(during, "c", silence) {
		t.Fatal("an echo while frozen")
	}
	p.Thaw()
	if echoes(before, "d", silence) || echoes(during, "e", silence) {
		t.Error("a connection open while frozen answered after the thaw")
	}
	if !echoes(dial(), "f", 5*time.Second) {
		t.Error("no echo on a connection opened after the thaw")
	}
}
