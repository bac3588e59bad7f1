package natsbus

// The URL: its parameters, their defaults, and parsing into a config.
// Parsing runs on the caller's goroutine (Open); a config is not written
// once parsed, so no lock guards it.

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the URL parameters.
const (
	DefaultConnectTimeout = 5 * time.Second
	DefaultReconnectWait  = 500 * time.Millisecond
	DefaultAckWait        = 30 * time.Second
	DefaultPublishWindow  = 4096
	DefaultPublishTimeout = 30 * time.Second
	DefaultDupeWindow     = 2 * time.Minute
)

// Defaults of the partitioned mode's URL parameters.
const (
	// DefaultLeaseTTL is how long a partition lease lives without being
	// refreshed (URL lease_ttl): how soon a crashed member's partitions
	// move to the others.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultRebalanceInterval is how often a member compares its share
	// of the partitions with the other members' (URL rebalance_interval).
	DefaultRebalanceInterval = time.Second
	// minLeaseTTL is the shortest lease_ttl accepted.
	minLeaseTTL = 500 * time.Millisecond
)

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
	tlsServerName  string
	creds          string
	nkey           string
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
	"name", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "creds", "nkey",
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
	cfg.tlsCA, cfg.tlsCert, cfg.tlsKey = q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key")
	cfg.tlsServerName, cfg.creds, cfg.nkey = q.Get("tls_server_name"), q.Get("creds"), q.Get("nkey")
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return nil, fmt.Errorf("natsbus: URL %q: tls_cert and tls_key go together: %w", cfg.redacted, driver.ErrInvalid)
	}
	if cfg.tlsCA != "" || cfg.tlsCert != "" || cfg.tlsServerName != "" {
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
		for _, name := range []string{"tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "creds", "nkey"} {
			if q.Has(name) {
				return nil, fmt.Errorf("natsbus: URL %q: %s: clients in the process reach the embedded server without TLS or credentials: %w",
					cfg.redacted, name, driver.ErrInvalid)
			}
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
