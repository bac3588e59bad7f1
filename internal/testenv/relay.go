package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Dir is a direction in which a Relay forwards.
type Dir int

const (
	ToServer Dir = iota // from the client to the server
	ToClient            // from the server to the client
)

// Relay is a TCP proxy on a loopback port between a test's clients and
// their server, for hostile tests that hold back, inspect or cut what
// passes. Each connection it accepts it relays to a connection of its own
// to the server, chunk by chunk in each direction; closing the relay
// closes them all. Set the fields, then call Start; they must not change
// after.
type Relay struct {
	// Read reads the next chunk to forward from src, as io.Reader does:
	// a chunk that comes with an error is forwarded before the error ends
	// the direction. Nil: what one Read returns, up to 32 KiB.
	Read func(src io.Reader) ([]byte, error)
	// Accept, when not nil, is called with each connection before
	// anything is relayed on it.
	Accept func(c *RelayConn)
	// Chunk, when not nil, is called with each chunk before it is
	// forwarded, and with a nil chunk when its side ends, before the end
	// is passed on (the other side closed). It may block: that direction
	// of that connection waits. A Chunk that blocks must return when Done
	// is closed.
	Chunk func(c *RelayConn, dir Dir, chunk []byte)

	ln     net.Listener
	target string
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup // the accept loop and two pipes a connection

	mu     sync.Mutex
	conns  []*RelayConn
	closed bool
}

// RelayConn is a connection a Relay accepted and the one it dialed to
// the server for it.
type RelayConn struct {
	conn [2]net.Conn   // by Dir: the side written to in that direction
	wmu  [2]sync.Mutex // by Dir: one chunk at a time
}

// Send writes b whole to the side dir goes to, between the chunks the
// relay forwards there.
func (c *RelayConn) Send(dir Dir, b []byte) error {
	c.wmu[dir].Lock()
	defer c.wmu[dir].Unlock()
	_, err := c.conn[dir].Write(b)
	return err
}

// Start listens on a loopback port and relays the connections it accepts
// to target (host:port) until Close, which cleanup calls.
func (r *Relay) Start(t testing.TB, target string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	r.ln, r.target, r.done = ln, target, make(chan struct{})
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
}

// Addr is the host:port the relay listens on.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Done is closed when Close has closed every connection.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Close closes the relay's port and every connection, as a network
// partition or a crashed host looks to both sides, then closes Done and
// waits for the relay's goroutines to end. It may be called more than
// once.
func (r *Relay) Close() {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		_ = r.ln.Close()
		for _, c := range r.conns {
			_ = c.conn[ToServer].Close()
			_ = c.conn[ToClient].Close()
		}
		r.mu.Unlock()
		close(r.done)
		r.wg.Wait()
	})
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &RelayConn{conn: [2]net.Conn{ToServer: server, ToClient: client}}
		r.mu.Lock()
		closed := r.closed
		if !closed {
			r.conns = append(r.conns, c)
			r.wg.Add(2)
		}
		r.mu.Unlock()
		if closed {
			_ = client.Close()
			_ = server.Close()
			return
		}
		if r.Accept != nil {
			r.Accept(c)
		}
		go r.pipe(c, ToServer)
		go r.pipe(c, ToClient)
	}
}

// pipe forwards what one side of c sends to the other, and closes the
// other when the side ends or a write fails.
func (r *Relay) pipe(c *RelayConn, dir Dir) {
	defer r.wg.Done()
	defer func() { _ = c.conn[dir].Close() }()
	src := c.conn[1-dir]
	read := r.Read
	if read == nil {
		buf := make([]byte, 32<<10)
		read = func(src io.Reader) ([]byte, error) {
			n, err := src.Read(buf)
			return buf[:n], err
		}
	}
	for {
		chunk, err := read(src)
		if len(chunk) > 0 {
			if r.Chunk != nil {
				r.Chunk(c, dir, chunk)
			}
			if c.Send(dir, chunk) != nil {
				return
			}
		}
		if err != nil {
			if r.Chunk != nil {
				r.Chunk(c, dir, nil)
			}
			return
		}
	}
}

// EchoServer answers on a loopback port with what it is sent, until
// cleanup.
func EchoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
