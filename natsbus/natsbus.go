package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Scheme is the URL scheme natsbus registers.
const Scheme = "nats"

// Defaults of the URL parameters.
const (
	DefaultConnectTimeout = 5 * time.Second
	DefaultReconnectWait  = 500 * time.Millisecond
	DefaultAckWait        = 30 * time.Second
	DefaultPublishWindow  = 4096
	DefaultPublishTimeout = 30 * time.Second
	DefaultDupeWindow     = 2 * time.Minute
)

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

// config is a parsed URL.
type config struct {
	redacted string
	servers  []string // empty for the embedded server
	embedded bool
	user     *url.Userinfo

	name           string
	tls            bool
	tlsCA          string
	tlsCert        string
	tlsKey         string
	creds          string
	connectTimeout time.Duration
	reconnectWait  time.Duration
	maxReconnects  int

	partitions    int // 0: unpartitioned
	ackWait       time.Duration
	maxAckPending int // 0: derived from MaxInFlight
	publishWindow int
	publishTO     time.Duration
	replicas      int
	maxAge        time.Duration
	dupeWindow    time.Duration
	storage       jetstream.StorageType
	inactive      time.Duration
	leaseTTL      time.Duration
	rebalance     time.Duration

	dir        string
	maxPayload int
}

var knownParams = []string{
	"name", "tls", "tls_ca", "tls_cert", "tls_key", "creds",
	"connect_timeout", "reconnect_wait", "max_reconnects",
	"partitions", "ack_wait", "max_ack_pending", "publish_window", "publish_timeout",
	"replicas", "max_age", "dupe_window", "storage", "inactive_threshold",
	"lease_ttl", "rebalance_interval",
	"dir", "max_payload",
}

func parseURL(u *url.URL) (*config, error) {
	if err := driver.CheckParams(u, knownParams...); err != nil {
		return nil, fmt.Errorf("natsbus: %w", err)
	}
	cfg := &config{
		redacted:       omnibus.RedactURL(u.String()),
		user:           u.User,
		name:           "omnibus",
		connectTimeout: DefaultConnectTimeout,
		reconnectWait:  DefaultReconnectWait,
		maxReconnects:  -1,
		ackWait:        DefaultAckWait,
		publishWindow:  DefaultPublishWindow,
		publishTO:      DefaultPublishTimeout,
		replicas:       1,
		dupeWindow:     DefaultDupeWindow,
		storage:        jetstream.FileStorage,
		leaseTTL:       DefaultLeaseTTL,
		rebalance:      DefaultRebalanceInterval,
	}
	bad := func(name, v, want string) error {
		return fmt.Errorf("natsbus: URL %q: %s=%q, want %s: %w", cfg.redacted, name, v, want, driver.ErrInvalid)
	}
	q := u.Query()
	ints := []struct {
		name string
		dst  *int
		min  int
	}{
		{"max_reconnects", &cfg.maxReconnects, -1},
		{"partitions", &cfg.partitions, 0},
		{"max_ack_pending", &cfg.maxAckPending, 1},
		{"publish_window", &cfg.publishWindow, 1},
		{"replicas", &cfg.replicas, 1},
		{"max_payload", &cfg.maxPayload, 1},
	}
	for _, p := range ints {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < p.min {
				return nil, bad(p.name, v, fmt.Sprintf("an integer >= %d", p.min))
			}
			*p.dst = n
		}
	}
	durs := []struct {
		name string
		dst  *time.Duration
		zero bool // 0 allowed
	}{
		{"connect_timeout", &cfg.connectTimeout, false},
		{"reconnect_wait", &cfg.reconnectWait, true},
		{"ack_wait", &cfg.ackWait, false},
		{"publish_timeout", &cfg.publishTO, false},
		{"max_age", &cfg.maxAge, true},
		{"dupe_window", &cfg.dupeWindow, false},
		{"inactive_threshold", &cfg.inactive, true},
		{"lease_ttl", &cfg.leaseTTL, false},
		{"rebalance_interval", &cfg.rebalance, false},
	}
	for _, p := range durs {
		if v := q.Get(p.name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || (d == 0 && !p.zero) {
				return nil, bad(p.name, v, "a positive duration such as 10s")
			}
			*p.dst = d
		}
	}
	if cfg.leaseTTL < minLeaseTTL {
		return nil, bad("lease_ttl", q.Get("lease_ttl"), "a duration of at least "+minLeaseTTL.String())
	}
	if v := q.Get("tls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, bad("tls", v, "true or false")
		}
		cfg.tls = b
	}
	switch v := q.Get("storage"); v {
	case "", "file":
	case "memory":
		cfg.storage = jetstream.MemoryStorage
	default:
		return nil, bad("storage", v, "file or memory")
	}
	if v := q.Get("name"); v != "" {
		cfg.name = v
	}
	cfg.tlsCA, cfg.tlsCert, cfg.tlsKey, cfg.creds = q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key"), q.Get("creds")
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return nil, fmt.Errorf("natsbus: URL %q: tls_cert and tls_key go together: %w", cfg.redacted, driver.ErrInvalid)
	}
	if cfg.tlsCA != "" || cfg.tlsCert != "" {
		cfg.tls = true
	}
	cfg.dir = q.Get("dir")

	host := u.Host
	if u.Opaque != "" || host == "" {
		return nil, fmt.Errorf("natsbus: URL %q has no host: want nats://host[:port] or nats://embedded: %w", cfg.redacted, driver.ErrInvalid)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("natsbus: URL %q: unexpected path (a \"/\" in a token or password must be written %%2F): %w",
			cfg.redacted, driver.ErrInvalid)
	}
	if host == EmbeddedHost {
		cfg.embedded = true
		if u.User != nil {
			return nil, fmt.Errorf("natsbus: URL %q: the embedded server takes no credentials: %w", cfg.redacted, driver.ErrInvalid)
		}
		return cfg, nil
	}
	for _, name := range []string{"dir", "max_payload"} {
		if q.Has(name) {
			return nil, fmt.Errorf("natsbus: URL %q: %s: %w: %w", cfg.redacted, name, errNotEmbedded, driver.ErrInvalid)
		}
	}
	scheme := "nats"
	if cfg.tls {
		scheme = "tls"
	}
	for h := range strings.SplitSeq(host, ",") {
		if h == "" {
			continue
		}
		if !strings.Contains(h, ":") || strings.HasSuffix(h, "]") {
			h += ":4222"
		}
		cfg.servers = append(cfg.servers, scheme+"://"+h)
	}
	if len(cfg.servers) == 0 {
		return nil, fmt.Errorf("natsbus: URL %q has no host: want nats://host[:port]: %w", cfg.redacted, driver.ErrInvalid)
	}
	return cfg, nil
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// conn is an open connection: one nats.Conn shared by publishers and
// every subscriber.
type conn struct {
	cfg *config
	nc  *nats.Conn
	js  jetstream.JetStream
	srv *Server // embedded server held, nil for an external one
	sem chan struct{}
	rr  atomic.Uint64

	subs driver.Subscribers[*sub]

	mu        sync.Mutex
	streams   map[string]*streamRef  // by topic
	ephemeral map[ephemeralGroup]int // members of throwaway groups on this connection
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

// streamRef is a topic's stream as this connection knows it.
type streamRef struct {
	name    string
	parts   int       // 0: unpartitioned (the single subject is the topic)
	created time.Time // tells this stream from an earlier one of the same name
}

func open(ctx context.Context, cfg *config, log *slog.Logger) (*conn, error) {
	c := &conn{cfg: cfg, sem: make(chan struct{}, cfg.publishWindow), streams: map[string]*streamRef{},
		ephemeral: map[ephemeralGroup]int{}}
	opts := []nats.Option{
		nats.Name(cfg.name),
		nats.MaxReconnects(cfg.maxReconnects),
		nats.ReconnectWait(cfg.reconnectWait),
		nats.ReconnectBufSize(64 << 20),
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
		if cfg.tls {
			opts = append(opts, nats.Secure())
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
	}
	fail := func(err error) (*conn, error) {
		if c.nc != nil {
			c.nc.Close()
		}
		if c.srv != nil {
			_ = releaseEmbedded(c.srv)
		}
		return nil, err
	}
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
		if r.err != nil {
			if c.srv != nil && c.srv.NATSServer() == nil {
				pid, url := c.srv.owner()
				return fail(fmt.Errorf("natsbus: connect %s: the embedded server of %q runs in process %d, at %s: %w",
					cfg.redacted, c.srv.dir, pid, url, r.err))
			}
			return fail(fmt.Errorf("natsbus: connect %s: %w", cfg.redacted, r.err))
		}
		c.nc = r.nc
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return fail(fmt.Errorf("natsbus: connect %s: %w", cfg.redacted, ctx.Err()))
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

func (c *conn) Capabilities() driver.Capabilities {
	caps := driver.Capabilities{
		Lag:    driver.LagDepth,
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

// CreateTopic implements driver.TopicCreator: it creates the topic's
// stream. A partitioned connection creates lanes partitions, and grows an
// existing topic to lanes partitions (keys then map differently, as on
// Kafka); an unpartitioned one has a single lane.
func (c *conn) CreateTopic(ctx context.Context, topic string, lanes int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	if err := checkTopic("create topic", topic); err != nil {
		return err
	}
	parts := 0
	if c.cfg.partitions > 0 {
		parts = lanes
	}
	ref, err := c.stream(ctx, topic, parts)
	if err != nil {
		return err
	}
	if parts > ref.parts {
		return c.grow(ctx, topic, ref, parts)
	}
	return nil
}

// stream returns the stream of topic, creating it with parts partitions
// (or the URL's default when 0) when it does not exist.
func (c *conn) stream(ctx context.Context, topic string, parts int) (*streamRef, error) {
	c.mu.Lock()
	ref := c.streams[topic]
	c.mu.Unlock()
	if ref != nil {
		return ref, nil
	}
	if parts == 0 {
		parts = c.cfg.partitions
	}
	name := streamName(topic)
	for try := 0; ; try++ {
		s, err := c.js.Stream(ctx, name)
		if err == nil {
			ref, err = c.checkStream(topic, s.CachedInfo())
			if err != nil {
				return nil, err
			}
			break
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("natsbus: stream %q of topic %q: %w", name, topic, classify(err))
		}
		sc := jetstream.StreamConfig{
			Name:        name,
			Description: "omnibus topic " + topic,
			Subjects:    subjects(topic, parts),
			Storage:     c.cfg.storage,
			Retention:   jetstream.LimitsPolicy,
			Replicas:    c.cfg.replicas,
			MaxAge:      c.cfg.maxAge,
			Duplicates:  c.cfg.dupeWindow,
		}
		s, err = c.js.CreateStream(ctx, sc)
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && try < 3 {
				continue // created concurrently: read it
			}
			return nil, fmt.Errorf("natsbus: create stream %q for topic %q (subjects %s): %w", name, topic, strings.Join(sc.Subjects, ", "), classify(err))
		}
		ref = &streamRef{name: name, parts: parts, created: s.CachedInfo().Created}
		break
	}
	c.mu.Lock()
	if old := c.streams[topic]; old != nil {
		ref = old
	} else {
		c.streams[topic] = ref
	}
	c.mu.Unlock()
	return ref, nil
}

func subjects(topic string, parts int) []string {
	if parts == 0 {
		return []string{topic}
	}
	subs := make([]string, parts)
	for p := range parts {
		subs[p] = partitionSubject(topic, p)
	}
	return subs
}

// checkStream checks that an existing stream has the layout this
// connection expects, and reads its partition count.
func (c *conn) checkStream(topic string, info *jetstream.StreamInfo) (*streamRef, error) {
	subs := info.Config.Subjects
	ref := &streamRef{name: info.Config.Name, created: info.Created}
	if c.cfg.partitions == 0 {
		if len(subs) == 1 && subs[0] == topic {
			return ref, nil
		}
		return nil, fmt.Errorf("natsbus: topic %q: stream %q has subjects %v, want [%s]; it was created partitioned (open the URL with partitions=N): %w",
			topic, ref.name, subs, topic, driver.ErrInvalid)
	}
	n := 0
	for n < len(subs) && slices.Contains(subs, partitionSubject(topic, n)) {
		n++
	}
	if n == 0 || n != len(subs) {
		return nil, fmt.Errorf("natsbus: topic %q: stream %q has subjects %v, want %s.0 ... %s.N-1; it was created unpartitioned (open the URL without partitions): %w",
			topic, ref.name, subs, topic, topic, driver.ErrInvalid)
	}
	ref.parts = n
	return ref, nil
}

// grow adds partitions to a partitioned topic.
func (c *conn) grow(ctx context.Context, topic string, ref *streamRef, parts int) error {
	s, err := c.js.Stream(ctx, ref.name)
	if err != nil {
		return fmt.Errorf("natsbus: create topic %q: %w", topic, classify(err))
	}
	sc := s.CachedInfo().Config
	sc.Subjects = subjects(topic, parts)
	if _, err := c.js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("natsbus: create topic %q: grow to %d partitions: %w", topic, parts, classify(err))
	}
	c.mu.Lock()
	c.streams[topic] = &streamRef{name: ref.name, parts: parts, created: ref.created}
	c.mu.Unlock()
	return nil
}

// forget drops the cached stream of topic (it was deleted under us).
func (c *conn) forget(topic string) {
	c.mu.Lock()
	delete(c.streams, topic)
	c.mu.Unlock()
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
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("%w: %w", err, driver.ErrRetryable)
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
	c.nc.Close()
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
