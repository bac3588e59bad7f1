package kafkabus

// The connection: Open, the admin client, the producers made per
// durability on first use, topic creation and Close. conn.mu guards the
// producers and the topic caches; conn.subs the open members.

import (
	"context"
	"crypto/tls"
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
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
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

// Driver is the kafkabus driver.Driver. Programs reach the zero Driver,
// registered for kafka:// and kafkas://, through omnibus.Open; one made
// by [New] carries options a URL cannot, and is given to omnibus.Open
// with omnibus.WithDriver.
type Driver struct {
	tls        *tls.Config
	clientOpts []kgo.Opt
}

// Open implements driver.Driver: it parses u, checks that a broker answers
// (bounded by ctx) and returns the connection.
func (d Driver) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	if d.tls != nil {
		for _, p := range tlsParams {
			if u.Query().Has(p) {
				return nil, invalid(u, "%s and WithTLS: the TLS configuration is WithTLS's", p)
			}
		}
	}
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	if d.tls != nil {
		cfg.tls, cfg.tlsGiven = true, d.tls
	}
	common, err := cfg.clientOpts()
	if err != nil {
		return nil, err
	}
	common = append(common, kgo.WithLogger(kgoLogger{opts.Logger}))
	common = append(common, d.clientOpts...)
	admin, err := kgo.NewClient(common...)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: open %s: %w: %w", cfg.redacted, err, driver.ErrInvalid)
	}
	if err := admin.Ping(ctx); err != nil {
		mechs, _ := admin.OptValue(kgo.SASL).([]sasl.Mechanism)
		admin.Close()
		return nil, cfg.openError(err, mechs)
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

	stamps stamps // record timestamps at committed offsets, for ages
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
		Age:             true,
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

// openError explains why no seed broker answered Open's ping, given the
// SASL mechanisms the client offered (the URL's, or WithClientOpts').
// Brokers refuse bad SASL credentials in one of two ways: a real one
// answers SASL_AUTHENTICATION_FAILED, others (kfake, proxies) close the
// connection in the middle of the exchange, which franz-go reports as a
// bare EOF (a closed connection at any other step is a
// *kgo.ErrFirstReadEOF, which says what it means).
func (c *config) openError(err error, mechs []sasl.Mechanism) error {
	var names []string
	for _, m := range mechs {
		names = append(names, m.Name())
	}
	who := ""
	if c.user != "" && c.pass != "" && redact.ShowName(c.user) { // a name alone may be a token
		who = fmt.Sprintf(" for user %q", c.user)
	}
	var first *kgo.ErrFirstReadEOF
	switch {
	case len(mechs) > 0 && (errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, io.EOF) && !errors.As(err, &first)):
		return fmt.Errorf("kafkabus: open %s: SASL %s authentication failed%s (check the credentials and the mechanism): %w",
			c.redacted, strings.Join(names, "/"), who, classify(err))
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Errorf("kafkabus: open %s: the brokers enable no SASL mechanism of %s: %w", c.redacted, strings.Join(names, ", "), classify(err))
	}
	return fmt.Errorf("kafkabus: open %s: no broker of %s answered: %w", c.redacted, strings.Join(c.seeds, ","), classify(err))
}

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
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.GroupIDNotFound):
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
