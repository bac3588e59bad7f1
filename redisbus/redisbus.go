package redisbus

// The connection: opening it (a go-redis client, the server's version
// and size limit checked), the capabilities, error classification, the
// subscribers' register and Close. It runs on the caller's goroutine.
// conn.mu guards the topic layouts, the replica count, the trim times
// and the throwaway groups' member counts.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Scheme is the URL scheme redisbus registers.
const Scheme = "redis"

func init() { omnibus.Register(Scheme, opener{}) }

type opener struct{}

// Open implements driver.Driver.
func (opener) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return open(ctx, cfg, opts.Logger)
}

// conn is an open connection: one go-redis client (a pool) shared by
// publishers and every subscriber's acknowledgements and leases; each
// subscriber reads on a client of its own (see reader.go).
type conn struct {
	cfg      *config
	rdb      *redis.Client
	log      *slog.Logger
	maxBytes int
	rr       atomic.Uint64 // round robin of keyless messages over partitions

	subs driver.Subscribers[*sub]

	mu        sync.Mutex
	layouts   map[string]int       // by topic: 0 unpartitioned, N partitions
	replicas  int                  // connected replicas, as last read
	replicaAt time.Time            // when replicas was read
	trimmed   map[string]time.Time // by stream: the last trim
	ephemeral map[string]int       // members of throwaway groups on this connection, by topic and group
}

// options returns the go-redis options of cfg: commands are never
// retried by the client library (the engine decides what is tried
// again), and RESP2 is spoken, which every Redis of version 7 speaks.
func (cfg *config) options() *redis.Options {
	return &redis.Options{
		Addr:            cfg.addr,
		Username:        cfg.user,
		Password:        cfg.password,
		DB:              cfg.db,
		ClientName:      cfg.name,
		TLSConfig:       cfg.tls,
		DialTimeout:     cfg.dialTO,
		PoolSize:        cfg.poolSize,
		MaxRetries:      -1,
		Protocol:        2,
		DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
}

func open(ctx context.Context, cfg *config, log *slog.Logger) (*conn, error) {
	c := &conn{cfg: cfg, log: log, rdb: redis.NewClient(cfg.options()),
		layouts: map[string]int{}, trimmed: map[string]time.Time{}, ephemeral: map[string]int{}}
	fail := func(err error) (*conn, error) {
		_ = c.rdb.Close()
		return nil, fmt.Errorf("redisbus: connect %s: %w", cfg.redacted, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.dialTO)
	defer cancel()
	info, err := c.rdb.Info(ctx, "server").Result()
	if err != nil {
		return fail(classify(err))
	}
	if v := infoField(info, "redis_version"); !atLeast(v, 7) {
		return fail(fmt.Errorf("the server is Redis %s; redisbus needs 7.0 or later (XAUTOCLAIM, XINFO GROUPS lag): %w", v, driver.ErrUnsupported))
	}
	// The server's limit on one bulk string (a message's body), when the
	// user may read the configuration; else Redis's default. A URL's
	// max_message_bytes may lower it.
	c.maxBytes = defaultBulkLen
	if kv, err := c.rdb.ConfigGet(ctx, "proto-max-bulk-len").Result(); err == nil {
		if n, err := strconv.Atoi(kv["proto-max-bulk-len"]); err == nil && n > 0 {
			c.maxBytes = n
		}
	}
	if cfg.maxBytes > 0 {
		c.maxBytes = min(c.maxBytes, cfg.maxBytes)
	}
	return c, nil
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// atLeast reports whether version (major.minor.patch) has a major
// version of at least major.
func atLeast(version string, major int) bool {
	m, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(m)
	return err == nil && n >= major
}

func (c *conn) Capabilities() driver.Capabilities {
	caps := driver.Capabilities{
		Lag:             driver.LagDepth,
		Age:             true,
		Groups:          true,
		Replay:          true,
		MaxMessageBytes: c.maxBytes,
	}
	if c.cfg.partitions > 0 {
		caps.Ordered, caps.ExclusiveLanes = true, true
	}
	return caps
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("redisbus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	if topic == "" {
		return fmt.Errorf("redisbus: %s: empty topic: %w", op, driver.ErrInvalid)
	}
	return nil
}

// classify wraps err with the driver sentinel that matches it.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("%w: %w", err, driver.ErrClosed)
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return fmt.Errorf("%w (the key holds another type than a stream): %w", err, driver.ErrInvalid)
	case redis.HasErrorPrefix(err, "NOGROUP"):
		return fmt.Errorf("%w: %w", err, driver.ErrNotFound)
	case redis.HasErrorPrefix(err, "WRONGPASS"), redis.HasErrorPrefix(err, "NOAUTH"), redis.HasErrorPrefix(err, "NOPERM"):
		return fmt.Errorf("%w: %w", err, driver.ErrInvalid)
	case redis.HasErrorPrefix(err, "LOADING"), redis.HasErrorPrefix(err, "BUSY "), redis.HasErrorPrefix(err, "TRYAGAIN"):
		// The server refused before acting.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	case errors.Is(err, redis.ErrPoolTimeout):
		// No connection was had: nothing was sent.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	}
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// No connection was made: nothing was sent.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	case errors.As(err, &op), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// The connection broke while the command was out (a server
		// restarting, a network fault): the server may have run it.
		return fmt.Errorf("%w: %w", err, driver.ErrOutcomeUnknown)
	}
	return err
}

// Close closes every subscriber, then the client. Close is idempotent.
func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	return c.rdb.Close()
}
