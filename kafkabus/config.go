package kafkabus

// Configuration: the URL's parameters with their defaults and Kafka's
// names, parsed once by Open, and the franz-go options they become (the
// common ones, a producer's per durability, a member's). Read-only after
// Open.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the URL parameters; see the package documentation.
const (
	DefaultPort            = "9092"
	DefaultClientID        = "omnibus"
	DefaultMaxMessageBytes = 1048588 // Kafka's message.max.bytes
	DefaultDLQSuffix       = ".dlq"
)

// metadataMinAge is the least time between two metadata requests of a
// client (Kafka's Java clients wait retry.backoff.ms, 100ms).
const metadataMinAge = 100 * time.Millisecond

// Values of the create_topics parameter.
const (
	CreateNone = "none" // never create a topic on first use
	CreateDLQ  = "dlq"  // create dead-letter topics (name ends in ".dlq") only
	CreateAll  = "all"  // create any topic on first use
)

// params are the URL query parameters kafkabus knows, in documentation
// order.
var params = []string{
	"client_id", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "mechanism",
	"create_topics", "partitions", "replication_factor",
	"compression", "linger", "max_message_bytes", "max_buffered_records",
	"idempotent", "delivery_timeout", "request_timeout",
	"session_timeout", "heartbeat_interval", "rebalance_timeout",
	"fetch_max_wait", "fetch_max_bytes", "fetch_max_partition_bytes",
	"metadata_max_age", "dial_timeout",
}

// tlsParams are the URL parameters of TLS; "tls" first.
var tlsParams = []string{"tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name"}

// config is a parsed URL.
type config struct {
	seeds    []string
	redacted string

	clientID      string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tlsGiven      *tls.Config // WithTLS's, in place of the tls_* parameters
	user, pass    string
	mechanism     string

	createTopics string
	partitions   int32
	replication  int16

	compression        string
	linger             time.Duration
	maxMessageBytes    int32
	maxBufferedRecords int
	idempotent         bool
	deliveryTimeout    time.Duration
	requestTimeout     time.Duration

	sessionTimeout    time.Duration
	heartbeat         time.Duration
	rebalanceTimeout  time.Duration
	fetchMaxWait      time.Duration
	fetchMaxBytes     int32
	fetchMaxPartBytes int32

	metadataMaxAge time.Duration
	dialTimeout    time.Duration
}

func invalid(u *url.URL, format string, args ...any) error {
	return fmt.Errorf("kafkabus: URL %q: %s: %w", omnibus.RedactURL(u.String()), fmt.Sprintf(format, args...), driver.ErrInvalid)
}

// parseURL reads u into a config. It rejects unknown parameters and bad
// values with errors wrapping driver.ErrInvalid.
func parseURL(u *url.URL) (*config, error) {
	if u.Scheme != Scheme && u.Scheme != SchemeTLS {
		return nil, invalid(u, "scheme %q, want %s or %s", u.Scheme, Scheme, SchemeTLS)
	}
	if err := driver.CheckParams(u, params...); err != nil {
		return nil, fmt.Errorf("kafkabus: %w", err)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, invalid(u, "no broker address (want %s://host:port[,host:port...])", u.Scheme)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, invalid(u, "unexpected path (a \"/\" in a password must be written %%2F)")
	}
	c := &config{
		redacted:           omnibus.RedactURL(u.String()),
		clientID:           DefaultClientID,
		tls:                u.Scheme == SchemeTLS,
		mechanism:          "PLAIN",
		createTopics:       CreateDLQ,
		partitions:         -1,
		replication:        -1,
		compression:        "none",
		maxMessageBytes:    DefaultMaxMessageBytes,
		maxBufferedRecords: 10000,
		idempotent:         true,
		deliveryTimeout:    2 * time.Minute,
		requestTimeout:     30 * time.Second,
		sessionTimeout:     45 * time.Second,
		heartbeat:          3 * time.Second,
		rebalanceTimeout:   time.Minute,
		fetchMaxWait:       500 * time.Millisecond,
		fetchMaxBytes:      50 << 20,
		fetchMaxPartBytes:  1 << 20,
		metadataMaxAge:     5 * time.Minute,
		dialTimeout:        10 * time.Second,
	}
	for _, hp := range strings.Split(u.Host, ",") {
		if hp == "" {
			return nil, invalid(u, "empty broker address")
		}
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(strings.Trim(hp, "[]"), DefaultPort)
		}
		c.seeds = append(c.seeds, hp)
	}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
	}

	q := u.Query()
	str := func(name string, dst *string, allowed ...string) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		if len(allowed) > 0 {
			ok := false
			for _, a := range allowed {
				if strings.EqualFold(v, a) {
					v, ok = a, true
				}
			}
			if !ok {
				return invalid(u, "%s=%q, want one of %s", name, v, strings.Join(allowed, ", "))
			}
		}
		*dst = v
		return nil
	}
	boolean := func(name string, dst *bool) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return invalid(u, "%s=%q, want true or false", name, v)
		}
		*dst = b
		return nil
	}
	dur := func(name string, dst *time.Duration, zeroOK bool) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || (d == 0 && !zeroOK) {
			return invalid(u, "%s=%q, want a positive duration such as 250ms", name, v)
		}
		*dst = d
		return nil
	}
	integer := func(name string, min, max int64, set func(int64)) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < min || n > max {
			return invalid(u, "%s=%q, want an integer in [%d, %d]", name, v, min, max)
		}
		set(n)
		return nil
	}
	errs := []error{
		str("client_id", &c.clientID),
		boolean("tls", &c.tls),
		str("tls_ca", &c.tlsCA),
		str("tls_cert", &c.tlsCert),
		str("tls_key", &c.tlsKey),
		str("tls_server_name", &c.tlsServerName),
		str("mechanism", &c.mechanism, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
		str("create_topics", &c.createTopics, CreateNone, CreateDLQ, CreateAll),
		integer("partitions", -1, 1<<20, func(n int64) { c.partitions = int32(n) }),
		integer("replication_factor", -1, 1<<15-1, func(n int64) { c.replication = int16(n) }),
		str("compression", &c.compression, "none", "gzip", "snappy", "lz4", "zstd"),
		dur("linger", &c.linger, true),
		integer("max_message_bytes", 512, 1<<30, func(n int64) { c.maxMessageBytes = int32(n) }),
		integer("max_buffered_records", 1, 1<<30, func(n int64) { c.maxBufferedRecords = int(n) }),
		boolean("idempotent", &c.idempotent),
		dur("delivery_timeout", &c.deliveryTimeout, false),
		dur("request_timeout", &c.requestTimeout, false),
		dur("session_timeout", &c.sessionTimeout, false),
		dur("heartbeat_interval", &c.heartbeat, false),
		dur("rebalance_timeout", &c.rebalanceTimeout, false),
		dur("fetch_max_wait", &c.fetchMaxWait, false),
		integer("fetch_max_bytes", 1, 1<<31-1, func(n int64) { c.fetchMaxBytes = int32(n) }),
		integer("fetch_max_partition_bytes", 1, 1<<31-1, func(n int64) { c.fetchMaxPartBytes = int32(n) }),
		dur("metadata_max_age", &c.metadataMaxAge, false),
		dur("dial_timeout", &c.dialTimeout, false),
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if c.partitions == 0 {
		return nil, invalid(u, "partitions=0, want -1 (broker default) or a positive count")
	}
	if c.replication == 0 {
		return nil, invalid(u, "replication_factor=0, want -1 (broker default) or a positive count")
	}
	for _, p := range tlsParams[1:] {
		if q.Has(p) && !c.tls {
			return nil, invalid(u, "%s needs TLS (the kafkas scheme, or tls=true)", p)
		}
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, invalid(u, "tls_cert and tls_key go together")
	}
	if c.user == "" && q.Get("mechanism") != "" {
		return nil, invalid(u, "mechanism given without a user name")
	}
	return c, nil
}

// clientOpts are the kgo options every client of a connection shares.
func (c *config) clientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.seeds...),
		kgo.ClientID(c.clientID),
		kgo.DialTimeout(c.dialTimeout),
		kgo.MetadataMaxAge(c.metadataMaxAge),
		// A refresh may follow the one before after metadataMinAge: a
		// topic created on first use is produced to at once, not after
		// franz-go's default of 5s.
		kgo.MetadataMinAge(min(c.metadataMaxAge, metadataMinAge)),
		kgo.RetryTimeout(c.requestTimeout),
	}
	if c.tls {
		tc := c.tlsGiven
		if tc == nil {
			var err error
			if tc, err = c.tlsConfig(); err != nil {
				return nil, fmt.Errorf("kafkabus: URL %q: %w", c.redacted, err)
			}
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if c.user != "" {
		opts = append(opts, kgo.SASL(c.saslMechanism()))
	}
	return opts, nil
}

// tlsConfig is the TLS configuration the URL's tls_* parameters describe.
// franz-go sets the server name of each connection to the broker's host
// unless tls_server_name names one.
func (c *config) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.tlsServerName}
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w: %w", err, driver.ErrInvalid)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca %q holds no PEM certificate: %w", c.tlsCA, driver.ErrInvalid)
		}
	}
	if c.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("tls_cert/tls_key: %w: %w", err, driver.ErrInvalid)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

func (c *config) saslMechanism() sasl.Mechanism {
	user, pass := c.user, c.pass
	switch c.mechanism {
	case "SCRAM-SHA-256":
		return scram.Sha256(func(context.Context) (scram.Auth, error) {
			return scram.Auth{User: user, Pass: pass}, nil
		})
	case "SCRAM-SHA-512":
		return scram.Sha512(func(context.Context) (scram.Auth, error) {
			return scram.Auth{User: user, Pass: pass}, nil
		})
	}
	return plain.Plain(func(context.Context) (plain.Auth, error) {
		return plain.Auth{User: user, Pass: pass}, nil
	})
}

// producerOpts are the options of the producer for durability d.
func (c *config) producerOpts(d driver.Durability) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2, as Kafka's Java client
		kgo.ProducerBatchMaxBytes(c.maxMessageBytes),
		kgo.ProducerLinger(c.linger),
		kgo.MaxBufferedRecords(c.maxBufferedRecords),
		kgo.RecordDeliveryTimeout(c.deliveryTimeout),
		kgo.ProduceRequestTimeout(c.requestTimeout),
		kgo.UnknownTopicRetries(2),
	}
	switch c.compression {
	case "gzip":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.GzipCompression()))
	case "snappy":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.SnappyCompression()))
	case "lz4":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	case "zstd":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	default:
		opts = append(opts, kgo.ProducerBatchCompression(kgo.NoCompression()))
	}
	switch d {
	case driver.DurabilityNone:
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	case driver.DurabilityLeader:
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
	default:
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
		if c.idempotent {
			// Publish honours its context even while a request is in
			// flight: the caller learns the outcome is unknown instead of
			// waiting on a dead broker. Retrying such a message may store
			// it twice, which at-least-once delivery allows (IDs tell).
			opts = append(opts, kgo.AllowIdempotentProduceCancellation())
		} else {
			opts = append(opts, kgo.DisableIdempotentWrite())
		}
	}
	return opts
}

// consumerOpts are the options of one group member.
// consumerOpts are a group member's options. What kgo buffers is capped
// like the engine's own bound: a fetch asks for at most the smaller of
// fetch_max_bytes and the subscription's MaxInFlightBytes.
func (c *config) consumerOpts(topic string, opts driver.SubscribeOptions) []kgo.Opt {
	reset := kgo.NewOffset().AtEnd()
	if opts.StartAt == driver.StartEarliest {
		reset = kgo.NewOffset().AtStart()
	}
	fetchMax := c.fetchMaxBytes
	if b := opts.MaxInFlightBytes; b > 0 && b < int(fetchMax) {
		fetchMax = int32(b)
	}
	return []kgo.Opt{
		kgo.ConsumerGroup(opts.Group),
		kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(reset),
		kgo.SessionTimeout(c.sessionTimeout),
		kgo.HeartbeatInterval(c.heartbeat),
		kgo.RebalanceTimeout(c.rebalanceTimeout),
		kgo.FetchMaxWait(c.fetchMaxWait),
		kgo.FetchMaxBytes(fetchMax),
		kgo.FetchMaxPartitionBytes(min(c.fetchMaxPartBytes, fetchMax)),
	}
}
