package natsbus

// The connection: opening it (the nats.go connection and its JetStream
// context, the embedded server when the URL names it), the capabilities,
// error classification, the subscribers' register and Close. It runs on
// the caller's goroutine; nats.go's handlers log from nats.go's own.
// conn.mu guards the stream cache and the throwaway groups' member counts.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// Scheme is the URL scheme natsbus registers.
const Scheme = "nats"

func init() { omnibus.Register(Scheme, Driver{}) }

// Driver is the natsbus driver.Driver. Programs reach the zero Driver,
// registered for nats://, through omnibus.Open; one made by [New]
// carries options a URL cannot, and is given to omnibus.Open with
// omnibus.WithDriver.
type Driver struct {
	tls      *tls.Config
	natsOpts []nats.Option
	nc       *nats.Conn
}

// Open implements driver.Driver.
func (d Driver) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	if err := d.check(u, cfg); err != nil {
		return nil, err
	}
	return open(ctx, cfg, opts.Logger, d)
}

// conn is an open connection: one nats.Conn shared by publishers and
// every subscriber.
type conn struct {
	cfg *config
	log *slog.Logger
	nc  *nats.Conn
	own bool // natsbus dialed nc, and closes it
	js  jetstream.JetStream
	srv *Server // embedded server held, nil for an external one
	sem chan struct{}
	rr  atomic.Uint64

	subs driver.Subscribers[*sub]

	mu        sync.Mutex
	streams   map[string]*streamRef  // by topic
	ephemeral map[ephemeralGroup]int // members of throwaway groups on this connection

	stamps stamps // stream times of the messages after ack floors, for ages
}

// ephemeralGroup names a throwaway group: only this connection knows its
// generated name, so its members all live here.
type ephemeralGroup struct{ stream, group string }

func (c *conn) joinEphemeral(stream, group string) {
	c.mu.Lock()
	c.ephemeral[ephemeralGroup{stream, group}]++
	c.mu.Unlock()
}

// leaveEphemeral reports whether the member leaving was the group's last.
func (c *conn) leaveEphemeral(stream, group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := ephemeralGroup{stream, group}
	c.ephemeral[k]--
	if c.ephemeral[k] > 0 {
		return false
	}
	delete(c.ephemeral, k)
	return true
}

func open(ctx context.Context, cfg *config, log *slog.Logger, d Driver) (*conn, error) {
	c := &conn{log: log, cfg: cfg, sem: make(chan struct{}, cfg.publishWindow), streams: map[string]*streamRef{},
		ephemeral: map[ephemeralGroup]int{}}
	opts := []nats.Option{
		nats.Name(cfg.name),
		nats.MaxReconnects(cfg.maxReconnects),
		nats.ReconnectWait(cfg.reconnectWait),
		// No reconnect buffer: a publish while the connection is away
		// fails at once (ErrRetryable) and is published again in order,
		// never sent later behind messages published after it.
		nats.ReconnectBufSize(-1),
		// nats.go reports what happens to the connection only through
		// these handlers: hand them to the client's logger.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("asynchronous error", "subject", subject, "err", err)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected, reconnecting", "url", cfg.redacted, "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected", "url", cfg.redacted) }),
	}
	timeout := cfg.connectTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	opts = append(opts, nats.Timeout(timeout))
	var serverURL string
	if cfg.embedded {
		s, err := acquireEmbedded(ctx, ServerConfig{Dir: cfg.dir, MaxPayload: cfg.maxPayload})
		if err != nil {
			return nil, err
		}
		c.srv = s
		serverURL = s.URL()
		if srv := s.NATSServer(); srv != nil {
			opts = append(opts, nats.InProcessServer(srv))
		} else {
			// Another process runs the directory's server; when it ends,
			// the dialer starts one here (see Server).
			opts = append(opts, nats.SetCustomDialer(dialer{s}))
		}
	} else {
		serverURL = strings.Join(cfg.servers, ",")
		if cfg.user != nil {
			if pw, ok := cfg.user.Password(); ok {
				opts = append(opts, nats.UserInfo(cfg.user.Username(), pw))
			} else {
				opts = append(opts, nats.Token(cfg.user.Username()))
			}
		}
		switch {
		case d.tls != nil:
			opts = append(opts, nats.Secure(d.tls))
		case cfg.tls:
			opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.tlsServerName}))
		}
		if cfg.tlsCA != "" {
			opts = append(opts, nats.RootCAs(cfg.tlsCA))
		}
		if cfg.tlsCert != "" {
			opts = append(opts, nats.ClientCert(cfg.tlsCert, cfg.tlsKey))
		}
		if cfg.creds != "" {
			opts = append(opts, nats.UserCredentials(cfg.creds))
		}
		if cfg.nkey != "" {
			o, err := nats.NkeyOptionFromSeed(cfg.nkey)
			if err != nil {
				return nil, fmt.Errorf("natsbus: URL %q: nkey: %w: %w", cfg.redacted, err, driver.ErrInvalid)
			}
			opts = append(opts, o)
		}
	}
	opts = append(opts, d.natsOpts...)
	fail := func(err error) (*conn, error) {
		if c.nc != nil && c.own {
			c.nc.Close()
		}
		if c.srv != nil {
			_ = releaseEmbedded(c.srv)
		}
		return nil, err
	}
	if d.nc != nil {
		c.nc = d.nc
	} else if err := c.connect(ctx, serverURL, opts); err != nil {
		return fail(err)
	}
	js, err := jetstream.New(c.nc,
		jetstream.WithPublishAsyncMaxPending(cfg.publishWindow+1),
		jetstream.WithPublishAsyncTimeout(cfg.publishTO))
	if err != nil {
		return fail(fmt.Errorf("natsbus: connect %s: %w", cfg.redacted, err))
	}
	c.js = js
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := js.AccountInfo(actx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fail(fmt.Errorf("natsbus: connect %s: JetStream is not enabled on the server (start nats-server with -js): %w", cfg.redacted, err))
		}
		return fail(fmt.Errorf("natsbus: connect %s: JetStream account info: %w", cfg.redacted, err))
	}
	return c, nil
}

// authError reports whether err is the server's refusal of a client's
// credentials. nats.go returns the server's -ERR text at connect, not
// nats.ErrAuthorization.
func authError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// credentials names what the client logged in with, for errors: never a
// password or token.
func (cfg *config) credentials() string {
	var what []string
	if cfg.user != nil {
		if _, ok := cfg.user.Password(); ok && redact.ShowName(cfg.user.Username()) {
			what = append(what, fmt.Sprintf("the password of user %q", cfg.user.Username()))
		} else if ok {
			what = append(what, "the password of the URL's user")
		} else {
			what = append(what, "the token")
		}
	}
	if cfg.nkey != "" {
		what = append(what, fmt.Sprintf("the nkey of %s", cfg.nkey))
	}
	if cfg.creds != "" {
		what = append(what, fmt.Sprintf("the credentials of %s", cfg.creds))
	}
	if cfg.tlsCert != "" {
		what = append(what, fmt.Sprintf("the certificate of %s", cfg.tlsCert))
	}
	if len(what) == 0 {
		return "the client (no credentials in the URL)"
	}
	return strings.Join(what, " and ")
}

// connect dials the server with opts, bounded by ctx, and sets c.nc and
// c.own. A connection that comes after ctx ended is closed.
func (c *conn) connect(ctx context.Context, serverURL string, opts []nats.Option) error {
	cfg := c.cfg
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(serverURL, opts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		switch {
		case r.err == nil:
			c.nc, c.own = r.nc, true
			return nil
		case c.srv != nil && c.srv.NATSServer() == nil:
			pid, url := c.srv.owner()
			return fmt.Errorf("natsbus: connect %s: the embedded server of %q runs in process %d, at %s: %w",
				cfg.redacted, c.srv.dir, pid, url, r.err)
		case authError(r.err):
			return fmt.Errorf("natsbus: connect %s: the server refused %s: %w", cfg.redacted, cfg.credentials(), r.err)
		}
		return fmt.Errorf("natsbus: connect %s: %w", cfg.redacted, r.err)
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return fmt.Errorf("natsbus: connect %s: %w", cfg.redacted, ctx.Err())
	}
}

func (c *conn) Capabilities() driver.Capabilities {
	caps := driver.Capabilities{
		Lag:    driver.LagDepth,
		Age:    true,
		Groups: true,
		Replay: true,
		// The payload limit covers headers too: leave room for ours.
		MaxMessageBytes: int(c.nc.MaxPayload()) - 1024,
	}
	if c.cfg.partitions > 0 {
		caps.Ordered, caps.ExclusiveLanes = true, true
	}
	return caps
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("natsbus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	return nil
}

// classify wraps err with the driver sentinel that matches it.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("%w: %w", err, driver.ErrNotFound)
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %w", err, driver.ErrTooLarge)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		// Nothing reached a server that could act on it.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		// Sent, with no answer: the connection dropped before the ack
		// (nats.go fails pending acks on reconnect), or none came in time.
		return fmt.Errorf("%w: %w", err, driver.ErrOutcomeUnknown)
	case errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("%w: %w", err, driver.ErrClosed)
	}
	return err
}

// Close closes every subscriber, then the connection, then releases the
// embedded server. Close is idempotent.
func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	// Acknowledgements are written asynchronously: push them out.
	_ = c.nc.FlushTimeout(2 * time.Second)
	if c.own {
		c.nc.Close()
	}
	if c.srv != nil {
		return releaseEmbedded(c.srv)
	}
	return nil
}

func (c *conn) addSub(s *sub) error {
	if !c.subs.Add(s) {
		return driver.ErrClosed
	}
	return nil
}

func (c *conn) removeSub(s *sub) { c.subs.Remove(s) }
