package omnibus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Durability is how far a publish must get before Publish returns.
type Durability = driver.Durability

// Durability levels. Each transport maps them to its own setting.
const (
	DurabilityAll    = driver.DurabilityAll
	DurabilityLeader = driver.DurabilityLeader
	DurabilityNone   = driver.DurabilityNone
)

// Capabilities is what a transport can do; see driver.Capabilities.
type Capabilities = driver.Capabilities

// Client is an open connection to one transport. It is safe for
// concurrent use. Create it with [Open] from a URL, or with [New] from a
// driver connection.
type Client struct {
	conn       driver.Conn
	caps       driver.Capabilities
	name       string // the redacted URL, or the scheme
	scheme     string
	durability Durability
	logger     *slog.Logger
	hooks      hookSet // bound to the client: its publishes
	rawHooks   []Hook  // as registered: bound again for each consumer

	mu sync.Mutex
	// closed is set under mu (ordered with consumers joining), and read
	// without it by checkOpen: every publish checks it, a lock a message.
	closed    atomic.Bool
	consumers map[*Consumer]struct{}

	sendMu  sync.Mutex // guards sending (coalesce.go)
	sending map[sendKey]*sendQueue
}

// Option configures a Client.
type Option func(*clientConfig) error

type clientConfig struct {
	durability *Durability
	logger     *slog.Logger
	hooks      []Hook
	driver     driver.Driver
}

// WithDurability sets the durability of every Publish on the client.
// Default: DurabilityAll, or the URL's durability parameter. Kafka: acks;
// RabbitMQ: publisher confirms; JetStream: publish acks.
func WithDurability(d Durability) Option {
	return func(c *clientConfig) error {
		if d < DurabilityAll || d > DurabilityNone {
			return fmt.Errorf("omnibus: invalid durability %d: %w", int(d), ErrInvalid)
		}
		c.durability = &d
		return nil
	}
}

// WithLogger sets the logger for the client and its consumers. Default:
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *clientConfig) error {
		if l == nil {
			return fmt.Errorf("omnibus: nil logger: %w", ErrInvalid)
		}
		c.logger = l
		return nil
	}
}

// WithDriver makes Open hand the URL to d instead of the driver
// registered for its scheme: the typed path for a transport configured
// in Go with what a URL cannot carry, a *tls.Config or the client
// library's own options (kafkabus.New, natsbus.New, rabbitbus.New).
// The URL is read as usual, and d must take its scheme. Default: the
// driver registered for the scheme. New, which is given a connection,
// refuses it.
func WithDriver(d driver.Driver) Option {
	return func(c *clientConfig) error {
		if d == nil {
			return fmt.Errorf("omnibus: nil driver: %w", ErrInvalid)
		}
		c.driver = d
		return nil
	}
}

// Open connects to the transport named by rawURL, whose scheme selects a
// registered driver (or the one given with [WithDriver]). The query parameter durability (none | leader | all)
// is read here for every transport; the driver rejects any other
// parameter it does not know. A URL without a host part (scheme:opaque or
// scheme:/path) is refused before any driver sees it. Errors never show
// the URL's credentials (see [RedactURL]).
func Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	u, portable, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if v := portable.Get("durability"); v != "" {
		dur, err := ParseDurability(v)
		if err != nil {
			return nil, fmt.Errorf("omnibus: URL %q: %w", RedactURL(rawURL), err)
		}
		opts = append([]Option{WithDurability(dur)}, opts...)
	}
	cfg, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	d := cfg.driver
	if d == nil {
		if d, err = lookup(u.Scheme); err != nil {
			return nil, err
		}
	}
	conn, err := d.Open(ctx, u, driver.OpenOptions{Logger: cfg.transportLogger(u.Scheme)})
	if err != nil {
		// Name the URL once: transports name the URL they were given in
		// their errors. A transport's client library might quote a
		// credential, which Redact hides.
		if strings.Contains(Redact(err.Error(), rawURL), RedactURL(u.String())) {
			err = fmt.Errorf("omnibus: %w", err)
		} else {
			err = fmt.Errorf("omnibus: open %s: %w", RedactURL(rawURL), err)
		}
		return nil, redactError(err, rawURL)
	}
	return newClient(conn, u.Scheme, RedactURL(rawURL), cfg), nil
}

// New returns a Client over an open driver connection: the typed path for
// callers who build a transport's connection themselves (for example
// membus.New()) instead of naming it by URL.
func New(conn driver.Conn, opts ...Option) (*Client, error) {
	if conn == nil {
		return nil, fmt.Errorf("omnibus: New: nil connection: %w", ErrInvalid)
	}
	cfg, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	if cfg.driver != nil {
		return nil, fmt.Errorf("omnibus: New: WithDriver is for Open; New is given its connection: %w", ErrInvalid)
	}
	name := transportName(conn)
	return newClient(conn, name, name, cfg), nil
}

func applyOptions(opts []Option) (clientConfig, error) {
	var cfg clientConfig
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// transportLogger is the client's logger (WithLogger, or slog.Default),
// naming the transport: the client, its consumers and its driver log
// through it.
func (cfg clientConfig) transportLogger(scheme string) *slog.Logger {
	l := cfg.logger
	if l == nil {
		l = slog.Default()
	}
	return l.With("transport", scheme)
}

func newClient(conn driver.Conn, scheme, name string, cfg clientConfig) *Client {
	c := &Client{
		conn:      conn,
		caps:      conn.Capabilities(),
		name:      name,
		scheme:    scheme,
		logger:    cfg.transportLogger(scheme),
		consumers: map[*Consumer]struct{}{},
		sending:   map[sendKey]*sendQueue{},
	}
	if cfg.durability != nil {
		c.durability = *cfg.durability
	}
	c.rawHooks = cfg.hooks
	c.hooks.add(bindHooks(cfg.hooks, HookScope{Transport: scheme})...)
	return c
}

// transportName names a connection made without a URL after its driver's
// package ("membus" for membus.New().Conn()).
func transportName(conn driver.Conn) string {
	t := reflect.TypeOf(conn)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if p := t.PkgPath(); p != "" {
		return path.Base(p)
	}
	return t.String()
}

// ParseDurability parses "none", "leader" or "all".
func ParseDurability(s string) (Durability, error) {
	switch s {
	case "all":
		return DurabilityAll, nil
	case "leader":
		return DurabilityLeader, nil
	case "none":
		return DurabilityNone, nil
	}
	return 0, fmt.Errorf("durability %q: want none, leader or all: %w", s, ErrInvalid)
}

// Capabilities reports what the transport guarantees.
func (c *Client) Capabilities() Capabilities { return c.caps }

// Durability is the client's publish durability.
func (c *Client) Durability() Durability { return c.durability }

// String returns the client's URL with any password redacted.
func (c *Client) String() string { return c.name }

// Driver returns the driver connection, for the transport's own extras.
func (c *Client) Driver() driver.Conn { return c.conn }

// Publish sends msgs to topic and returns when each has reached the
// client's durability. It fills empty IDs and zero Times in msgs.
// A header named content-type, or starting with ce_, ce- or cloudEvents:
// (a CloudEvents binding's names, see Message), is an error wrapping
// ErrInvalid and nothing is sent.
//
// A message whose publish failed with an error the transport marked
// ErrRetryable (the server cannot have acted on it) or ErrOutcomeUnknown
// (the connection was lost before the server answered) is published
// again with the same ID, after a backoff (25ms doubling to 1s), until it
// lands, fails otherwise, or ctx ends: a broker restart or a leader
// change within ctx's deadline is ridden through. Without a deadline,
// Publish waits for as long as the transport keeps failing that way.
// Where the transport cannot drop a copy by its ID, a message published
// again after an unknown outcome may be stored twice (each transport's
// documentation says). PublishRetryHook sees each try again.
//
// Concurrent publishes to a topic share the transport's round trips:
// while four are in flight, later calls wait and are sent together, as
// one batch, each caller getting its own messages' outcome. For many
// messages from one goroutine, use a Publisher.
//
// When some messages of the batch fail, Publish returns a *PublishError
// listing them; the others landed. Any other error means no message can
// be assumed to have landed.
//
// Once Publish has returned, even because ctx ended while the transport
// still had the messages in flight, nothing reads msgs any more: the
// caller may change or reuse them, and a message that lands later lands
// as it was given.
func (c *Client) Publish(ctx context.Context, topic string, msgs ...*Message) error {
	if err := c.prepare(topic, msgs, time.Now()); err != nil || len(msgs) == 0 {
		return err
	}
	var end func(error)
	if hs := c.hooks.publish; len(hs) > 0 {
		ctx, end = wrap(ctx, hs, func(h PublishHook, ctx context.Context) (context.Context, func(error)) {
			return h.OnPublish(ctx, topic, msgs)
		})
	}
	dms := make([]driver.Message, len(msgs))
	ptrs := make([]*driver.Message, len(msgs))
	for i, m := range msgs {
		dms[i] = toDriver(m)
		ptrs[i] = &dms[i]
	}
	err := c.publishRetrying(ctx, topic, ptrs, driver.PublishOptions{Durability: c.durability}, false)
	if end != nil {
		end(err)
	}
	return err
}

// prepare checks a publish of msgs to topic and fills their empty IDs and
// zero Times.
func (c *Client) prepare(topic string, msgs []*Message, now time.Time) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	if topic == "" {
		return fmt.Errorf("omnibus: publish: empty topic: %w", ErrInvalid)
	}
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("omnibus: publish %q: message %d is nil: %w", topic, i, ErrInvalid)
		}
		for k := range m.Headers {
			if driver.ReservedHeader(k) {
				return fmt.Errorf("omnibus: publish %q: message %d: header %q is a CloudEvents binding's name (set ContentType for the content type): %w", topic, i, k, ErrInvalid)
			}
		}
	}
	for _, m := range msgs {
		fill(m, now)
	}
	return nil
}

// publish is one try of a publish: what is over the transport's size limit
// fails alone, the rest goes to the driver (coalesced with concurrent
// publishes unless direct, see coalesce.go).
func (c *Client) publish(ctx context.Context, topic string, ms []*driver.Message, opts driver.PublishOptions, direct bool) error {
	if failed := c.oversized(ms); failed != nil {
		return c.publishRest(ctx, topic, ms, opts, direct, failed)
	}
	err := c.send(ctx, topic, ms, opts, direct)
	return wrapPublishError(topic, ms, nil, err)
}

// queue is publish for a transport that keeps its own window in flight
// (driver.Queuer): done gets what publish would return. An error means
// nothing was queued and done is not called.
func (c *Client) queue(ctx context.Context, queuer driver.Queuer, topic string, ms []*driver.Message, opts driver.PublishOptions, done func(error)) error {
	var index []int
	failed := c.oversized(ms)
	if failed != nil {
		ms, index = without(ms, failed)
	}
	if len(ms) == 0 {
		done(wrapPublishError(topic, ms, index, nil, failed...))
		return nil
	}
	return queuer.Queue(ctx, topic, ms, opts, func(err error) {
		done(wrapPublishError(topic, ms, index, err, failed...))
	})
}

// oversized returns the failures of the messages of ms over the
// transport's size limit, in order; nil when none is.
func (c *Client) oversized(ms []*driver.Message) []PublishFailure {
	max := c.caps.MaxMessageBytes
	if max <= 0 {
		return nil
	}
	var failed []PublishFailure
	for i, m := range ms {
		if n := m.Size(); n > max {
			failed = append(failed, PublishFailure{Index: i, ID: m.ID,
				Err: fmt.Errorf("%d bytes, limit %d: %w", n, max, ErrTooLarge)})
		}
	}
	return failed
}

// without returns the messages of ms not failed (failed in ms's order),
// and their positions in ms.
func without(ms []*driver.Message, failed []PublishFailure) ([]*driver.Message, []int) {
	rest := make([]*driver.Message, 0, len(ms)-len(failed))
	index := make([]int, 0, cap(rest))
	f := 0
	for i, m := range ms {
		if f < len(failed) && failed[f].Index == i {
			f++
			continue
		}
		rest = append(rest, m)
		index = append(index, i)
	}
	return rest, index
}

// publishRest publishes the messages not already failed and merges the
// failures, so one oversized message does not stop the rest.
func (c *Client) publishRest(ctx context.Context, topic string, ms []*driver.Message, opts driver.PublishOptions, direct bool, failed []PublishFailure) error {
	rest, index := without(ms, failed)
	var err error
	if len(rest) > 0 {
		err = c.send(ctx, topic, rest, opts, direct)
	}
	return wrapPublishError(topic, rest, index, err, failed...)
}

// wrapPublishError turns a driver error into a *PublishError. index maps
// positions in ms to positions in the caller's arguments (nil: identity).
func wrapPublishError(topic string, ms []*driver.Message, index []int, err error, failed ...PublishFailure) error {
	if err == nil && len(failed) == 0 {
		return nil
	}
	pos := func(i int) int {
		if index == nil {
			return i
		}
		return index[i]
	}
	var be *driver.MessageErrors
	switch {
	case err == nil:
	case errors.As(err, &be) && len(be.Errs) == len(ms):
		for i, e := range be.Errs {
			if e != nil {
				failed = append(failed, PublishFailure{Index: pos(i), ID: ms[i].ID, Err: e})
			}
		}
	default:
		if len(failed) == 0 {
			return fmt.Errorf("omnibus: publish %q: %w", topic, err)
		}
		for i, m := range ms {
			failed = append(failed, PublishFailure{Index: pos(i), ID: m.ID, Err: err})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	slicesSortFailures(failed)
	return &PublishError{Topic: topic, Failed: failed}
}

// CreateTopic makes sure topic exists with at least lanes lanes, on
// transports whose topics need creating. On the others it returns nil.
func (c *Client) CreateTopic(ctx context.Context, topic string, lanes int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	if lanes < 1 {
		return fmt.Errorf("omnibus: create topic %q: lanes %d, want at least 1: %w", topic, lanes, ErrInvalid)
	}
	tc, ok := c.conn.(driver.TopicCreator)
	if !ok {
		return nil
	}
	if err := tc.CreateTopic(ctx, topic, lanes); err != nil {
		return fmt.Errorf("omnibus: create topic %q: %w", topic, err)
	}
	return nil
}

func (c *Client) checkOpen(op, topic string) error {
	if c.closed.Load() {
		return fmt.Errorf("omnibus: %s %q: %w", op, topic, ErrClosed)
	}
	return nil
}

// Close closes every consumer of the client at once (see Consumer.Close),
// then the connection. Close is idempotent; use Consumer.Shutdown first to
// drain.
//
// Called from a handler or observer, Close cannot wait for its caller: it
// closes everything in the background and returns nil at once.
func (c *Client) Close() error {
	if calledFromEngine() {
		go c.Close()
		return nil
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	consumers := make([]*Consumer, 0, len(c.consumers))
	for k := range c.consumers {
		consumers = append(consumers, k)
	}
	c.closed.Store(true)
	c.mu.Unlock()
	errs := make([]error, 0, len(consumers)+1)
	for _, k := range consumers {
		errs = append(errs, k.Close())
	}
	return joinErrors(append(errs, c.conn.Close()))
}

func (c *Client) addConsumer(k *Consumer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return ErrClosed
	}
	c.consumers[k] = struct{}{}
	return nil
}

func (c *Client) removeConsumer(k *Consumer) {
	c.mu.Lock()
	delete(c.consumers, k)
	c.mu.Unlock()
}
