package testenv

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// readWithin reads len(want) bytes from c and checks they are want.
func readWithin(t *testing.T, c net.Conn, limit time.Duration, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// TestRelay: bytes go through the relay both ways; a Chunk hook that
// blocks holds its direction until it returns, and the other direction
// goes on; Send puts bytes between the chunks; Close ends the
// connections, the held one included, and Done.
func TestRelay(t *testing.T) {
	var mu sync.Mutex
	var held chan struct{} // non-nil while the answers are held
	var toServer bytes.Buffer
	r := &Relay{}
	r.Chunk = func(c *RelayConn, dir Dir, chunk []byte) {
		mu.Lock()
		h := held
		if dir == ToServer {
			toServer.Write(chunk)
		}
		mu.Unlock()
		if dir == ToClient && chunk != nil && h != nil {
			select {
			case <-h:
			case <-r.Done():
			}
		}
	}
	var accepted []*RelayConn
	r.Accept = func(c *RelayConn) {
		mu.Lock()
		accepted = append(accepted, c)
		mu.Unlock()
	}
	r.Start(t, EchoServer(t))
	// hold holds the answers from now on, or lets them go.
	hold := func(on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			held = make(chan struct{})
		} else {
			close(held)
			held = nil
		}
	}

	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	write := func(s string) {
		t.Helper()
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	write("hello")
	readWithin(t, c, 5*time.Second, "hello")

	hold(true)
	write("held")
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes (%v) while the answers are held", n, err)
	}
	mu.Lock()
	sent, c0 := toServer.String(), accepted[0]
	mu.Unlock()
	if sent != "helloheld" {
		t.Errorf("the server was sent %q, want %q", sent, "helloheld")
	}
	hold(false)
	readWithin(t, c, 5*time.Second, "held")
	if err := c0.Send(ToClient, []byte("sent")); err != nil {
		t.Fatal(err)
	}
	readWithin(t, c, 5*time.Second, "sent")

	hold(true)
	write("cut")
	time.Sleep(100 * time.Millisecond) // the answer reaches the hook
	r.Close()
	select {
	case <-r.Done():
	default:
		t.Fatal("Done is open after Close")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 8)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes (%v) after Close; want the connection's end", n, err)
	}
	if _, err := net.Dial("tcp", r.Addr()); err == nil {
		t.Error("the relay accepts connections after Close")
	}
}
