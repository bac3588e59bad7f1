package rabbitbus

// The connection: Open (the URL, the publishing link, the probe for the
// consistent-hash exchange), the capabilities, the subscribers' link,
// await (amqp091-go calls bounded by a context) and Close. It runs on the
// caller's goroutine, and await's calls on goroutines of their own,
// counted in conn.bg. conn.mu guards the subscribers' link and the
// declarations (see topology.go).

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// URL schemes rabbitbus registers.
const (
	Scheme    = "amqp"
	SchemeTLS = "amqps"
)

func init() {
	omnibus.Register(Scheme, Driver{})
	omnibus.Register(SchemeTLS, Driver{})
}

// Driver is the rabbitbus driver.Driver. Programs reach the zero Driver,
// registered for amqp:// and amqps://, through omnibus.Open; one made by
// [New] carries options a URL cannot, and is given to omnibus.Open with
// omnibus.WithDriver.
type Driver struct {
	tls  *tls.Config
	amqp *amqp.Config
}

// Open implements driver.Driver. It dials once, so that bad credentials,
// a missing virtual host or an unreachable server fail here.
func (d Driver) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseConfig(u)
	if err != nil {
		return nil, err
	}
	if err := d.apply(u, cfg); err != nil {
		return nil, err
	}
	c := &conn{cfg: cfg, declared: map[string]declared{}, names: map[string]bool{}, dead: map[string]bool{}}
	c.log = opts.Logger
	pl, err := newLink(ctx, cfg, "publish", c.log)
	if err != nil {
		return nil, err
	}
	c.pub = pl
	if cfg.partitions > 0 {
		if err := c.probeHashExchange(ctx); err != nil {
			pl.close()
			return nil, err
		}
	}
	c.publisher = newPublisher(c)
	return c, nil
}

// conn is a driver.Conn: one connection for publishing, one (opened on
// the first Subscribe) shared by the subscribers' channels, as RabbitMQ
// advises, so that flow control on publishers does not stall consumers.
type conn struct {
	cfg       *config
	log       *slog.Logger
	pub       *link
	publisher *publisher

	// subs says whether Close began. Close sets it before it takes mu
	// once, so a check of subs.Closed() made under mu orders with Close:
	// await's bg.Add and subLink's dial happen before Close reads them,
	// or not at all.
	subs driver.Subscribers[*sub]

	mu       sync.Mutex
	sub      *link               // nil until the first Subscribe
	declared map[string]declared // topology key -> when it was declared
	names    map[string]bool     // every exchange ("x:name") and queue ("q:name") declared, for tests
	dead     map[string]bool     // topics the engine dead-letters to

	bg sync.WaitGroup // calls await left running after their caller's ctx ended
}

func (c *conn) Capabilities() driver.Capabilities {
	part := c.cfg.partitions > 0
	return driver.Capabilities{
		Ordered:         part,
		Lag:             driver.LagDepth,
		Age:             true,
		ExclusiveLanes:  part,
		Groups:          true,
		Replay:          false,
		MaxMessageBytes: c.cfg.maxBytes,
	}
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("rabbitbus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	return nil
}

// subLink returns the subscribers' connection, dialing it the first time.
func (c *conn) subLink(ctx context.Context) (*link, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs.Closed() {
		return nil, driver.ErrClosed
	}
	if c.sub != nil {
		return c.sub, nil
	}
	l, err := newLink(ctx, c.cfg, "consume", c.log)
	if err != nil {
		return nil, err
	}
	c.sub = l
	return l, nil
}

// Close closes the subscribers, fails unconfirmed publishes with
// ErrClosed and closes both connections. It is idempotent, and returns
// within closeTimeout of the subscribers' Close even while the server
// blocks the connection (a write stuck on it fails when the connection
// closes).
func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	c.mu.Lock()
	sl := c.sub
	c.mu.Unlock()
	c.publisher.stop()
	c.pub.close() // ends writes stuck on a blocked connection
	c.publisher.wait()
	if sl != nil {
		sl.close()
	}
	c.bg.Wait()
	return nil
}

// await runs fn, an amqp091-go call or a sequence of them, and waits for
// it until ctx ends. amqp091-go's calls take no context, and every call
// that writes blocks while the server blocks the connection
// (connection.blocked, during a memory or disk alarm) or the socket
// stalls; await lets the caller go at its deadline with ctx's error.
// fn then goes on by itself, on a goroutine counted in c.bg, and ends
// when its calls do: at the latest when Close closes the connection.
// Once Close has begun fn runs on the caller's goroutine (Close waits
// for c.bg), and ends when Close closes the connection.
func (c *conn) await(ctx context.Context, fn func() error) error {
	if ctx.Done() == nil {
		return fn()
	}
	c.mu.Lock()
	closed := c.subs.Closed()
	if !closed {
		c.bg.Add(1)
	}
	c.mu.Unlock()
	if closed {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		defer c.bg.Done()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
