package rabbitbus

// Connections: dialing one (and explaining a failure without showing a
// credential), and the link, one AMQP connection kept up with backoff.
// Its goroutines are supervise, which reconnects, and per connection
// watchBlocked, which follows connection.blocked; link.mu guards the
// current connection, its generation and whether the server blocks it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// Reconnection backoff: doubling from the minimum, capped, jittered.
const (
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 3 * time.Second
)

// dial opens one AMQP connection; ctx bounds the TCP connect.
func (c *config) dial(ctx context.Context) (*amqp.Connection, error) {
	cfg := c.amqp
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		var conn net.Conn
		var err error
		if c.userDial != nil {
			conn, err = c.userDial(network, addr)
		} else {
			d := net.Dialer{Timeout: c.dialTO, KeepAlive: 30 * time.Second}
			conn, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		// The handshake is bounded too; amqp091 clears the deadline after it.
		dl := time.Now().Add(c.dialTO)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		_ = conn.SetDeadline(dl)
		return conn, nil
	}
	ac, err := amqp.DialConfig(c.url, cfg)
	if err != nil {
		return nil, c.openError(err)
	}
	return ac, nil
}

// who names the URL's user for errors: the name when the URL has a
// password, else nothing, as a user name alone may be a secret; or the
// SASL mechanisms WithConfig gave, which take the user's place.
func (c *config) who() string {
	if len(c.amqp.SASL) > 0 {
		var names []string
		for _, a := range c.amqp.SASL {
			names = append(names, a.Mechanism())
		}
		return "SASL " + strings.Join(names, "/")
	}
	if c.user == "" {
		return "the URL's user"
	}
	return fmt.Sprintf("user %q", c.user)
}

// openError explains a failed dial without showing a credential.
func (c *config) openError(err error) error {
	who := c.who()
	err = redact.Error(err, c.url)
	var ae *amqp.Error
	switch {
	case errors.Is(err, amqp.ErrCredentials), errors.As(err, &ae) && ae.Code == amqp.AccessRefused && strings.Contains(ae.Reason, "Login"):
		check := "the user name and password"
		if len(c.amqp.SASL) > 0 {
			check = "the credentials, and the server's auth_mechanisms"
		}
		return fmt.Errorf("rabbitbus: open %q: authentication failed for %s (check %s): %w", c.redacted, who, check, err)
	case errors.As(err, &ae) && ae.Code == amqp.NotAllowed && strings.Contains(ae.Reason, "vhost"), errors.Is(err, amqp.ErrVhost):
		return fmt.Errorf("rabbitbus: open %q: virtual host %q not found or not permitted for %s: %w: %w", c.redacted, c.vhost, who, driver.ErrNotFound, err)
	case errors.As(err, &ae) && ae.Code == amqp.FrameError && c.amqp.TLSClientConfig == nil:
		// A TLS listener's alert, read as an AMQP frame.
		return fmt.Errorf("rabbitbus: open %q: the server's answer is no AMQP: does the port want TLS (amqps://)? %w", c.redacted, err)
	}
	return fmt.Errorf("rabbitbus: open %q: %w", c.redacted, err)
}

// connectionLost reports whether err says that the connection or the
// channel went away (a broker restart, a dropped socket), as opposed to
// the server refusing the request. A request that failed that way was
// not taken whole by the server, or was taken with no answer reaching
// us.
func connectionLost(err error) bool {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		// 504: the channel or connection is not open (amqp.ErrClosed);
		// 320: the broker closes the connection (shutting down); 501: the
		// client's write failed and it shut the connection.
		return ae.Code == amqp.ChannelError || ae.Code == amqp.ConnectionForced || ae.Code == amqp.FrameError
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// --- connection supervision ---

// closeTimeout bounds closing a connection: how long Close waits for the
// server to answer connection.close before it drops the socket, which
// also fails a write stuck on it. A connection the server blocks is
// dropped at once: the server reads nothing from it.
const closeTimeout = time.Second

// link is one AMQP connection that reconnects with backoff when it
// drops. Users ask it for the current connection with get and watch the
// connection's or their channel's NotifyClose themselves.
//
// Goroutines: supervise (reconnects; ended by close) and, per
// connection, watchBlocked (follows connection.blocked; ends when the
// connection closes), both waited for by close.
type link struct {
	cfg  *config
	name string
	log  *slog.Logger

	mu      sync.Mutex
	ac      *amqp.Connection // nil while down
	gen     uint64           // counts connections made
	up      chan struct{}    // closed while ac is set
	lastErr error
	closed  bool
	// unblocked is non-nil while the server blocks ac (connection.blocked,
	// a memory or disk alarm: it stops reading from connections that
	// publish) and is closed when it unblocks or ac goes.
	unblocked   chan struct{}
	blockReason string

	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup // watchBlocked
}

func newLink(ctx context.Context, cfg *config, name string, log *slog.Logger) (*link, error) {
	ac, err := cfg.dial(ctx)
	if err != nil {
		return nil, err
	}
	l := &link{cfg: cfg, name: name, log: log, up: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	l.set(ac)
	go l.supervise(ac)
	return l, nil
}

func (l *link) set(ac *amqp.Connection) {
	blocks := ac.NotifyBlocked(make(chan amqp.Blocking, 1))
	l.mu.Lock()
	l.ac = ac
	l.gen++
	gen := l.gen
	l.unblockLocked()
	close(l.up)
	l.mu.Unlock()
	l.wg.Add(1)
	go l.watchBlocked(gen, blocks)
}

// watchBlocked follows connection.blocked and connection.unblocked on
// the connection of generation gen until it closes.
func (l *link) watchBlocked(gen uint64, blocks <-chan amqp.Blocking) {
	defer l.wg.Done()
	for b := range blocks {
		l.mu.Lock()
		if l.gen == gen {
			if !b.Active {
				l.unblockLocked()
			} else if l.unblocked == nil {
				l.unblocked, l.blockReason = make(chan struct{}), b.Reason
			}
		}
		l.mu.Unlock()
		if b.Active {
			l.log.Warn("the server blocks the connection (memory or disk alarm); publishing waits", "connection", l.name, "url", l.cfg.redacted, "reason", b.Reason)
		} else {
			l.log.Info("the server unblocked the connection", "connection", l.name, "url", l.cfg.redacted)
		}
	}
}

func (l *link) unblockLocked() {
	if l.unblocked != nil {
		close(l.unblocked)
		l.unblocked, l.blockReason = nil, ""
	}
}

// blocked returns a channel closed when the server unblocks the current
// connection, and why it blocks it; a nil channel when it does not.
func (l *link) blocked() (<-chan struct{}, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unblocked == nil {
		return nil, ""
	}
	return l.unblocked, l.blockReason
}

func (l *link) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ac == nil {
		return 0
	}
	return l.gen
}

// get returns the current connection, waiting for a reconnection until
// ctx ends.
func (l *link) get(ctx context.Context) (*amqp.Connection, uint64, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, 0, driver.ErrClosed
		}
		if l.ac != nil && !l.ac.IsClosed() {
			ac, gen := l.ac, l.gen
			l.mu.Unlock()
			return ac, gen, nil
		}
		up, lastErr, stale := l.up, l.lastErr, l.ac != nil
		l.mu.Unlock()
		if stale { // closed but not yet noticed by supervise
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
			continue
		}
		select {
		case <-up:
		case <-l.stop:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, 0, fmt.Errorf("%w (waiting for the connection to come back; last attempt: %v)", ctx.Err(), lastErr)
			}
			return nil, 0, ctx.Err()
		}
	}
}

func (l *link) supervise(ac *amqp.Connection) {
	defer close(l.done)
	for {
		closed := ac.NotifyClose(make(chan *amqp.Error, 1))
		var reason *amqp.Error
		select {
		case reason = <-closed:
		case <-l.stop:
			l.closeConn(ac)
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return
		}
		l.ac = nil
		l.up = make(chan struct{})
		l.unblockLocked()
		l.mu.Unlock()
		l.log.Warn("connection lost, reconnecting", "connection", l.name, "url", l.cfg.redacted, "reason", redact.Text(fmt.Sprint(reason), l.cfg.url))
		for attempt := 1; ; attempt++ {
			select {
			case <-time.After(backoff(attempt)):
			case <-l.stop:
				return
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-l.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			next, err := l.cfg.dial(ctx)
			cancel()
			if err == nil {
				ac = next
				break
			}
			l.mu.Lock()
			l.lastErr = err
			l.mu.Unlock()
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			l.closeConn(ac)
			return
		}
		l.lastErr = nil
		l.mu.Unlock()
		l.set(ac)
		l.log.Info("reconnected", "connection", l.name, "url", l.cfg.redacted)
	}
}

// closeConn closes ac within closeTimeout, at once while the server
// blocks it.
func (l *link) closeConn(ac *amqp.Connection) {
	deadline := time.Now().Add(closeTimeout)
	if unblocked, _ := l.blocked(); unblocked != nil {
		deadline = time.Now()
	}
	_ = ac.CloseDeadline(deadline)
}

func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	l.wg.Wait()
}

// backoff is the delay before reconnection attempt n (1-based).
func backoff(n int) time.Duration { return driver.Backoff(n, reconnectMin, reconnectMax) }
