package nsqbus

// The connection: Open (the URL, reaching the cluster, the server's
// limits), the capabilities and Close. Open and Close run on the
// caller's goroutine; the publisher and the subscribers keep their own
// state (publish.go, subscribe.go).

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Scheme is the URL scheme nsqbus registers.
const Scheme = "nsq"

func init() { omnibus.Register(Scheme, opener{}) }

type opener struct{}

// Open implements driver.Driver. It reaches the cluster once, so that an
// unreachable nsqd or nsqlookupd, or a secret the server refuses, fail
// here: in direct mode it connects to the first nsqd (IDENTIFY, AUTH);
// in lookup mode it asks the nsqlookupds for their nsqds. Then it reads
// the server's limits from its HTTP API.
func (opener) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseConfig(u)
	if err != nil {
		return nil, err
	}
	c := &conn{
		cfg:    cfg,
		raw:    u.String(),
		log:    opts.Logger,
		client: &http.Client{Timeout: cfg.dialTO + 10*time.Second},
		limits: defaultLimits,
	}
	c.pub = newPublisher(c)
	nodes, err := c.reach(ctx)
	if err != nil {
		c.pub.close()
		return nil, err
	}
	c.limits = c.readLimits(ctx, nodes)
	return c, nil
}

// conn is a driver.Conn.
type conn struct {
	cfg    *config
	raw    string // the URL as given, for redacting what client libraries say
	log    *slog.Logger
	client *http.Client // nsqd's and nsqlookupd's HTTP APIs
	limits limits
	pub    *publisher
	lookup lookupCache

	subs driver.Subscribers[*sub]
}

func (c *conn) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordered:         false,
		Lag:             driver.LagDepth,
		Age:             true,
		ExclusiveLanes:  false,
		Groups:          true,
		Replay:          false,
		MaxMessageBytes: c.limits.bodyBytes(c.cfg.binary),
	}
}

// reach checks that the cluster answers: the first nsqd of the URL
// (direct mode), or at least one nsqlookupd (lookup mode). It returns
// the nsqds it knows of.
func (c *conn) reach(ctx context.Context) ([]node, error) {
	if c.cfg.lookup {
		nodes, err := c.nodes(ctx, "")
		if err != nil {
			return nil, fmt.Errorf("nsqbus: open %s: %w", c.cfg.redacted, err)
		}
		return nodes, nil
	}
	nodes, _ := c.nodes(ctx, "")
	if err := c.pub.ping(ctx, nodes[0].tcp); err != nil {
		return nil, fmt.Errorf("nsqbus: open %s: %w", c.cfg.redacted, err)
	}
	return nodes, nil
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("nsqbus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	return nil
}

// Close closes the subscribers (each hands back what it holds) and the
// producers. It is idempotent.
func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	c.pub.close()
	c.client.CloseIdleConnections()
	return nil
}
