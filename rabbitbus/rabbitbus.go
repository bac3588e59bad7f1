package rabbitbus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// URL schemes rabbitbus registers.
const (
	Scheme    = "amqp"
	SchemeTLS = "amqps"
)

// Defaults of the URL parameters.
const (
	DefaultQueueType       = "classic"
	DefaultMaxMessageBytes = 128 << 20 // RabbitMQ 3.10's max_message_size
	DefaultHeartbeat       = 10 * time.Second
	DefaultConnectTimeout  = 30 * time.Second
	DefaultRebalance       = 2 * time.Second
)

// Reconnection backoff: doubling from the minimum, capped, jittered.
const (
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 3 * time.Second
)

var params = []string{
	"queue_type", "partitions", "mandatory", "max_message_bytes", "heartbeat",
	"connect_timeout", "rebalance", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure",
}

func init() {
	omnibus.Register(Scheme, opener{})
	omnibus.Register(SchemeTLS, opener{})
}

type opener struct{}

// config is a parsed URL.
type config struct {
	url        string // without query, with credentials: for dialing only
	redacted   string // the URL as errors show it
	user       string
	vhost      string
	amqp       amqp.Config
	dialTO     time.Duration
	queueType  string
	partitions int
	mandatory  bool
	maxBytes   int
	rebalance  time.Duration
}

func (c *config) quorum() bool { return c.queueType == "quorum" }

func parseConfig(u *url.URL) (*config, error) {
	if err := driver.CheckParams(u, params...); err != nil {
		return nil, fmt.Errorf("rabbitbus: %w", err)
	}
	cfg := &config{
		redacted:  omnibus.RedactURL(u.String()),
		queueType: DefaultQueueType,
		maxBytes:  DefaultMaxMessageBytes,
		rebalance: DefaultRebalance,
		dialTO:    DefaultConnectTimeout,
		amqp:      amqp.Config{Heartbeat: DefaultHeartbeat, Properties: amqp.NewConnectionProperties()},
	}
	bad := func(name, v, want string) error {
		return fmt.Errorf("rabbitbus: URL %q: %s=%q, want %s: %w", cfg.redacted, name, v, want, driver.ErrInvalid)
	}
	q := u.Query()
	if v := q.Get("queue_type"); v != "" {
		if v != "classic" && v != "quorum" {
			return nil, bad("queue_type", v, "classic or quorum")
		}
		cfg.queueType = v
	}
	for name, dst := range map[string]*int{"partitions": &cfg.partitions, "max_message_bytes": &cfg.maxBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || (name == "partitions" && n > 1024) {
				return nil, bad(name, v, "a positive integer (partitions at most 1024)")
			}
			*dst = n
		}
	}
	for name, dst := range map[string]*time.Duration{"heartbeat": &cfg.amqp.Heartbeat, "connect_timeout": &cfg.dialTO, "rebalance": &cfg.rebalance} {
		if v := q.Get(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, bad(name, v, "a positive duration such as 10s")
			}
			*dst = d
		}
	}
	if v := q.Get("mandatory"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, bad("mandatory", v, "true or false")
		}
		cfg.mandatory = b
	}
	if u.Scheme == SchemeTLS {
		tc, err := tlsConfig(u, q)
		if err != nil {
			return nil, fmt.Errorf("rabbitbus: URL %q: %w", cfg.redacted, err)
		}
		cfg.amqp.TLSClientConfig = tc
	} else {
		for _, p := range []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure"} {
			if q.Has(p) {
				return nil, fmt.Errorf("rabbitbus: URL %q: %s needs the amqps scheme: %w", cfg.redacted, p, driver.ErrInvalid)
			}
		}
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("rabbitbus: URL %q has no host: want %s://user:password@host[:port][/vhost]: %w", cfg.redacted, u.Scheme, driver.ErrInvalid)
	}
	if strings.Contains(u.EscapedPath(), "@") {
		return nil, fmt.Errorf("rabbitbus: URL %q: \"@\" in the path (a \"/\" in a password must be written %%2F, an \"@\" in a vhost %%40): %w",
			cfg.redacted, driver.ErrInvalid)
	}
	plain := *u
	plain.RawQuery = ""
	plain.Fragment = ""
	cfg.url = plain.String()
	uri, err := amqp.ParseURI(cfg.url)
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: URL %q: %v: %w", cfg.redacted, omnibus.Redact(err.Error(), u.String()), driver.ErrInvalid)
	}
	cfg.vhost = uri.Vhost
	if _, hasPass := u.User.Password(); hasPass || u.User == nil {
		cfg.user = uri.Username // a user name alone is shown nowhere, as a token would not be
	}
	cfg.amqp.Vhost = uri.Vhost
	cfg.amqp.Properties.SetClientConnectionName("omnibus")
	return cfg, nil
}

func tlsConfig(u *url.URL, q url.Values) (*tls.Config, error) {
	tc := &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	if v := q.Get("tls_server_name"); v != "" {
		tc.ServerName = v
	}
	if v := q.Get("tls_insecure"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("tls_insecure=%q, want true or false: %w", v, driver.ErrInvalid)
		}
		tc.InsecureSkipVerify = b
	}
	if f := q.Get("tls_ca"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca %q: no PEM certificate found: %w", f, driver.ErrInvalid)
		}
	}
	cert, key := q.Get("tls_cert"), q.Get("tls_key")
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("tls_cert and tls_key go together: %w", driver.ErrInvalid)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// dial opens one AMQP connection; ctx bounds the TCP connect.
func (c *config) dial(ctx context.Context) (*amqp.Connection, error) {
	cfg := c.amqp
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: c.dialTO, KeepAlive: 30 * time.Second}
		conn, err := d.DialContext(ctx, network, addr)
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
// password, else nothing, as a user name alone may be a secret.
func (c *config) who() string {
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
		return fmt.Errorf("rabbitbus: open %q: authentication failed for %s (check the user name and password): %w", c.redacted, who, err)
	case errors.As(err, &ae) && ae.Code == amqp.NotAllowed && strings.Contains(ae.Reason, "vhost"), errors.Is(err, amqp.ErrVhost):
		return fmt.Errorf("rabbitbus: open %q: virtual host %q not found or not permitted for %s: %w: %w", c.redacted, c.vhost, who, driver.ErrNotFound, err)
	}
	return fmt.Errorf("rabbitbus: open %q: %w", c.redacted, err)
}

// Open implements driver.Driver. It dials once, so that bad credentials,
// a missing virtual host or an unreachable server fail here.
func (opener) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseConfig(u)
	if err != nil {
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

// declared is an entry of the declaration cache.
type declared struct {
	gen uint64    // the publish link's connection it was declared on
	at  time.Time // when the declaration was sent
}

func (c *conn) Capabilities() driver.Capabilities {
	part := c.cfg.partitions > 0
	return driver.Capabilities{
		Ordered:         part,
		Lag:             driver.LagDepth,
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

// CreateTopic implements driver.TopicCreator: it declares the topic's
// exchange (and, for a ".dlq" topic, its dead-letter queue). The number of
// lanes is fixed by the URL's partitions parameter, so lanes is ignored.
func (c *conn) CreateTopic(ctx context.Context, topic string, _ int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	return c.ensureTopic(ctx, topic)
}

// --- topology ---

// dlqSuffix marks a dead-letter topic: its exchange gets a durable queue
// of the same name bound to it, so dead letters are kept even when no
// consumer group reads the topic.
const dlqSuffix = ".dlq"

func groupQueue(topic, group string) string { return topic + ":" + group }
func hashExchange(topic, group string) string {
	return topic + ":" + group
}
func partitionQueue(topic, group string, p int) string {
	return topic + ":" + group + ":" + strconv.Itoa(p)
}

// EphemeralExpiry is how long the queues of a throwaway group (one the
// user did not name) outlive their last consumer (RabbitMQ's x-expires),
// so that a reconnect finds them and nothing is left behind for long.
const EphemeralExpiry = time.Minute

func (c *conn) queueArgs() amqp.Table {
	return amqp.Table{amqp.QueueTypeArg: c.cfg.queueType}
}

// record notes a name about to be declared (for the tests' cleanup: a
// declaration cut short by a closing connection may still have landed).
func (c *conn) record(kind, name string) {
	c.mu.Lock()
	c.names[kind+":"+name] = true
	c.mu.Unlock()
}

// declaredNames returns every exchange ("x:") and queue ("q:") this
// connection declared.
func (c *conn) declaredNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// withChannel runs fn on a short-lived channel of l's connection, until
// ctx ends (see await). Declarations use their own channel because a
// failed one closes the channel it ran on.
func (c *conn) withChannel(ctx context.Context, l *link, fn func(ch *amqp.Channel) error) (uint64, error) {
	ac, gen, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return gen, c.await(ctx, func() error {
		ch, err := ac.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		defer func() { _ = ch.Close() }()
		return fn(ch)
	})
}

// ensure declares the topology named key once per connection, and again
// once the declaration is older than maxAge (0: never), which renews the
// lease of a queue declared with x-expires.
func (c *conn) ensure(ctx context.Context, key string, maxAge time.Duration, fn func(ch *amqp.Channel) error) error {
	gen := c.pub.generation()
	c.mu.Lock()
	d := c.declared[key]
	c.mu.Unlock()
	if gen != 0 && d.gen == gen && (maxAge == 0 || time.Since(d.at) < maxAge) {
		return nil
	}
	at := time.Now()
	got, err := c.withChannel(ctx, c.pub, fn)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.declared[key] = declared{gen: got, at: at}
	c.mu.Unlock()
	return nil
}

// forget drops key from the declaration cache, or the whole cache when
// key is empty, after the server said something declared is gone.
func (c *conn) forget(key string) {
	c.mu.Lock()
	if key == "" {
		clear(c.declared)
	} else {
		delete(c.declared, key)
	}
	c.mu.Unlock()
}

// ensureTopic declares topic's durable topic exchange and, for a
// dead-letter topic, its queue.
func (c *conn) ensureTopic(ctx context.Context, topic string) error {
	err := c.ensure(ctx, "x:"+topic, 0, func(ch *amqp.Channel) error {
		c.record("x", topic)
		if err := declareTopic(ch, topic); err != nil {
			return err
		}
		c.mu.Lock()
		dead := c.dead[topic]
		c.mu.Unlock()
		if dead || strings.HasSuffix(topic, dlqSuffix) {
			c.record("q", topic)
			if _, err := ch.QueueDeclare(topic, true, false, false, false, c.queueArgs()); err != nil {
				return err
			}
			if err := ch.QueueBind(topic, "#", topic, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return c.topologyError("declare topic", topic, err)
	}
	return nil
}

func declareTopic(ch *amqp.Channel, topic string) error {
	return ch.ExchangeDeclare(topic, amqp.ExchangeTopic, true, false, false, false, nil)
}

// topologyError classifies a declaration failure.
func (c *conn) topologyError(op, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.PreconditionFailed:
			return fmt.Errorf("rabbitbus: %s %q: it exists with other settings (queue_type is %s): %w: %w", op, name, c.cfg.queueType, driver.ErrInvalid, err)
		case amqp.AccessRefused:
			return fmt.Errorf("rabbitbus: %s %q: %s may not: %w: %w", op, name, c.cfg.who(), driver.ErrInvalid, redact.Error(err, c.cfg.url))
		case amqp.NotFound:
			return fmt.Errorf("rabbitbus: %s %q: %w: %w", op, name, driver.ErrNotFound, err)
		}
	}
	return fmt.Errorf("rabbitbus: %s %q: %w", op, name, err)
}

// probeHashExchange checks that the consistent-hash exchange type exists.
// Declaring an unknown exchange type closes the whole connection, so the
// probe runs on a connection of its own.
func (c *conn) probeHashExchange(ctx context.Context) error {
	ac, err := c.cfg.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = ac.Close() }()
	ch, err := ac.Channel()
	if err != nil {
		return fmt.Errorf("rabbitbus: open %q: %w", c.cfg.redacted, err)
	}
	name := "omnibus.probe." + strconv.FormatUint(rand.Uint64(), 36)
	if err := ch.ExchangeDeclare(name, "x-consistent-hash", false, true, false, false, nil); err != nil {
		return fmt.Errorf("rabbitbus: open %q: partitions needs the consistent-hash exchange; enable it on the server with "+
			"`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`: %w: %w", c.cfg.redacted, driver.ErrUnsupported, err)
	}
	_ = ch.ExchangeDelete(name, false, false)
	return nil
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
