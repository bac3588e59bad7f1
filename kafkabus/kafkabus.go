package kafkabus

// The connection: Open, the admin client, the producers made per
// durability on first use, topic creation and Close. conn.mu guards the
// producers and the topic caches; conn.subs the open members.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// URL schemes kafkabus registers.
const (
	Scheme    = "kafka"
	SchemeTLS = "kafkas"
)

func init() {
	omnibus.Register(Scheme, Driver{})
	omnibus.Register(SchemeTLS, Driver{})
}

// Driver is the kafkabus driver.Driver. Programs reach it through
// omnibus.Open with a kafka:// or kafkas:// URL; it is exported for callers
// who build a connection themselves and hand it to omnibus.New.
type Driver struct{}

// Open implements driver.Driver: it parses u, checks that a broker answers
// (bounded by ctx) and returns the connection.
func (Driver) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	common, err := cfg.clientOpts()
	if err != nil {
		return nil, err
	}
	common = append(common, kgo.WithLogger(kgoLogger{opts.Logger}))
	admin, err := kgo.NewClient(common...)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: open %s: %w: %w", cfg.redacted, err, driver.ErrInvalid)
	}
	if err := admin.Ping(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("kafkabus: open %s: no broker of %s answered: %w", cfg.redacted, strings.Join(cfg.seeds, ","), classify(err))
	}
	return &conn{
		cfg:    cfg,
		log:    opts.Logger,
		common: common,
		admin:  admin,
		adm:    kadm.NewClient(admin),
		known:  map[string]bool{},
		dead:   map[string]bool{},
	}, nil
}

type conn struct {
	cfg    *config
	log    *slog.Logger
	common []kgo.Opt
	admin  *kgo.Client // metadata and admin requests
	adm    *kadm.Client

	subs driver.Subscribers[*sub]

	mu        sync.Mutex
	producers [3]*kgo.Client // by driver.Durability, created on first use
	known     map[string]bool
	dead      map[string]bool // topics the engine dead-letters to
}

// recordOverhead is what a record costs on the wire beyond what
// driver.Message.Size counts (the record batch's header, the record's
// framing, the CloudEvents headers' names and time): MaxMessageBytes
// leaves room for it, so that a message the portable layer lets through
// is not refused by the broker (a dead letter cut to fit, say).
const recordOverhead = 512

// Capabilities implements driver.Conn.
func (c *conn) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordered:         true,
		Lag:             driver.LagRecords,
		ExclusiveLanes:  true,
		Groups:          true,
		Replay:          true,
		MaxMessageBytes: int(c.cfg.maxMessageBytes) - recordOverhead,
	}
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("kafkabus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	return nil
}

// Close implements driver.Conn. It closes the subscribers still open, the
// producers (records not yet acknowledged fail) and the admin client.
func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	// producer checks for Close under mu: none is made after this.
	c.mu.Lock()
	producers := c.producers
	c.producers = [3]*kgo.Client{}
	c.mu.Unlock()
	for _, p := range producers {
		if p != nil {
			p.Close()
		}
	}
	c.admin.Close()
	return nil
}

// producer returns the producer client for durability d, creating it on
// first use.
func (c *conn) producer(d driver.Durability) (*kgo.Client, error) {
	if d < driver.DurabilityAll || d > driver.DurabilityNone {
		return nil, fmt.Errorf("kafkabus: durability %v: %w", d, driver.ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs.Closed() {
		return nil, driver.ErrClosed
	}
	if p := c.producers[d]; p != nil {
		return p, nil
	}
	p, err := kgo.NewClient(append(c.common[:len(c.common):len(c.common)], c.cfg.producerOpts(d)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: producer: %w: %w", err, driver.ErrInvalid)
	}
	c.producers[d] = p
	return p, nil
}

// --- topics ---

// CreateTopic implements driver.TopicCreator: it makes sure topic exists
// with at least n partitions, creating it or adding partitions. The
// replication factor is the URL's replication_factor.
func (c *conn) CreateTopic(ctx context.Context, topic string, n int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("kafkabus: create topic %q: %d partitions: %w", topic, n, driver.ErrInvalid)
	}
	have, err := c.partitionCount(ctx, topic)
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		return fmt.Errorf("kafkabus: create topic %q: %w", topic, err)
	}
	if errors.Is(err, driver.ErrNotFound) {
		if err := c.createTopic(ctx, topic, int32(n)); err != nil {
			return fmt.Errorf("kafkabus: create topic %q: %w", topic, err)
		}
		return c.waitTopic(ctx, topic, n)
	}
	if have >= n {
		return nil
	}
	resp, err := c.adm.UpdatePartitions(ctx, n, topic)
	if err == nil {
		var r kadm.CreatePartitionsResponse
		if r, err = resp.On(topic, nil); err == nil {
			err = r.Err
		}
	}
	if err != nil && !errors.Is(err, kerr.InvalidPartitions) {
		return fmt.Errorf("kafkabus: create topic %q: add partitions %d -> %d: %w", topic, have, n, classify(err))
	}
	if err := c.waitTopic(ctx, topic, n); err != nil {
		return err
	}
	// Members of this connection notice the new partitions at once
	// instead of at the next metadata refresh.
	for _, s := range c.subs.All() {
		if s.topic == topic {
			s.cl.ForceMetadataRefresh()
		}
	}
	return nil
}

// createTopic creates topic, treating "already exists" as success.
func (c *conn) createTopic(ctx context.Context, topic string, n int32) error {
	resp, err := c.adm.CreateTopic(ctx, n, c.cfg.replication, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		if resp.ErrMessage != "" {
			err = fmt.Errorf("%w (%s)", err, resp.ErrMessage)
		}
		return classify(err)
	}
	return nil
}

// waitTopic waits until the metadata shows topic with at least n
// partitions, so that a produce right after creation does not race the
// controller.
func (c *conn) waitTopic(ctx context.Context, topic string, n int) error {
	for {
		have, err := c.partitionCount(ctx, topic)
		if err == nil && have >= n {
			c.mu.Lock()
			c.known[topic] = true
			c.mu.Unlock()
			return nil
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			return fmt.Errorf("kafkabus: create topic %q: %w", topic, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkabus: create topic %q: waiting for %d partitions: %w", topic, n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// partitionCount reads topic's partition count from a metadata request;
// the error wraps driver.ErrNotFound when the topic does not exist.
func (c *conn) partitionCount(ctx context.Context, topic string) (int, error) {
	tds, err := c.adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", classify(err))
	}
	td, ok := tds[topic]
	if !ok {
		return 0, fmt.Errorf("topic does not exist: %w", driver.ErrNotFound)
	}
	if td.Err != nil {
		return 0, fmt.Errorf("metadata: %w", classify(td.Err))
	}
	return len(td.Partitions), nil
}

// autoCreate reports whether topic is created on first use.
func (c *conn) autoCreate(topic string) bool {
	switch c.cfg.createTopics {
	case CreateAll:
		return true
	case CreateDLQ:
		c.mu.Lock()
		dead := c.dead[topic]
		c.mu.Unlock()
		return dead || strings.HasSuffix(topic, DefaultDLQSuffix)
	}
	return false
}

// ensureTopic makes sure topic exists before the first publish or
// subscribe, creating it when create_topics says so; it remembers topics
// seen, so only the first use costs a metadata request.
func (c *conn) ensureTopic(ctx context.Context, op, topic string) error {
	if topic == "" {
		return fmt.Errorf("kafkabus: %s: empty topic: %w", op, driver.ErrInvalid)
	}
	c.mu.Lock()
	known := c.known[topic]
	c.mu.Unlock()
	if known {
		return nil
	}
	_, err := c.partitionCount(ctx, topic)
	switch {
	case err == nil:
	case errors.Is(err, driver.ErrNotFound) && c.autoCreate(topic):
		if err := c.createTopic(ctx, topic, c.cfg.partitions); err != nil {
			return fmt.Errorf("kafkabus: %s %q: create topic: %w", op, topic, err)
		}
		if err := c.waitTopic(ctx, topic, 1); err != nil {
			return fmt.Errorf("kafkabus: %s %q: %w", op, topic, err)
		}
	case errors.Is(err, driver.ErrNotFound):
		return fmt.Errorf("kafkabus: %s %q: %w (create it first, or open with create_topics=all)", op, topic, err)
	default:
		return fmt.Errorf("kafkabus: %s %q: %w", op, topic, err)
	}
	c.mu.Lock()
	c.known[topic] = true
	c.mu.Unlock()
	return nil
}

func (c *conn) forget(topic string) {
	c.mu.Lock()
	delete(c.known, topic)
	c.mu.Unlock()
}

// --- errors ---

// classify wraps err with the driver sentinel that matches it, keeping err
// reachable with errors.As.
func classify(err error) error {
	var ke *kerr.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kgo.ErrClientClosed):
		return fmt.Errorf("%w: %w", err, driver.ErrClosed)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return fmt.Errorf("%w: %w", err, driver.ErrTooLarge)
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return fmt.Errorf("%w: %w", err, driver.ErrNotFound)
	case errors.Is(err, kerr.NotEnoughReplicas), errors.Is(err, kerr.NotLeaderForPartition),
		errors.Is(err, kerr.LeaderNotAvailable), errors.Is(err, kerr.CoordinatorNotAvailable),
		errors.Is(err, kerr.NotCoordinator), errors.Is(err, kerr.CoordinatorLoadInProgress):
		// The broker rejected the request before acting on it.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries):
		// franz-go gave up on a record it may have written: its own
		// retries (deduplicated by the idempotent producer) are over.
		return fmt.Errorf("%w: %w", err, driver.ErrOutcomeUnknown)
	case errors.As(err, &ke):
		return err
	}
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// No connection, so no request reached a broker.
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
	case errors.As(err, &op), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// The connection dropped with a request on it.
		return fmt.Errorf("%w: %w", err, driver.ErrOutcomeUnknown)
	}
	return err
}
