package redisbus

// The URL: its parameters, their defaults, and parsing into a config.
// Parsing runs on the caller's goroutine (Open); a config is not written
// once parsed, so no lock guards it.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the URL parameters.
const (
	DefaultPort        = "6379"
	DefaultDialTimeout = 5 * time.Second
	DefaultClaimIdle   = 30 * time.Second
	DefaultWaitTimeout = 5 * time.Second
	DefaultLeaseTTL    = 10 * time.Second
	DefaultRebalance   = time.Second
	minLeaseTTL        = 500 * time.Millisecond
	minClaimIdle       = 100 * time.Millisecond
	defaultBulkLen     = 512 << 20 // Redis's default proto-max-bulk-len
	defaultName        = "omnibus"
)

var knownParams = []string{
	"name", "db", "tls", "tls_ca", "dial_timeout", "pool_size",
	"claim_idle", "maxlen", "max_age", "trim_unread", "max_message_bytes", "wait_timeout",
	"partitions", "lease_ttl", "rebalance_interval",
}

// config is a parsed URL.
type config struct {
	redacted string
	addr     string
	user     string
	password string
	db       int
	name     string
	tls      *tls.Config // nil: plain TCP
	dialTO   time.Duration
	poolSize int // 0: go-redis's default

	claimIdle  time.Duration
	maxLen     int64
	maxAge     time.Duration
	trimUnread bool
	maxBytes   int // 0: read proto-max-bulk-len at Open
	waitTO     time.Duration

	partitions int // 0: unpartitioned
	leaseTTL   time.Duration
	rebalance  time.Duration
}

// trims reports whether the URL asks for trimming.
func (c *config) trims() bool { return c.maxLen > 0 || c.maxAge > 0 }

func parseURL(u *url.URL) (*config, error) {
	if err := driver.CheckParams(u, knownParams...); err != nil {
		return nil, fmt.Errorf("redisbus: %w", err)
	}
	cfg := &config{
		redacted:  omnibus.RedactURL(u.String()),
		name:      defaultName,
		dialTO:    DefaultDialTimeout,
		claimIdle: DefaultClaimIdle,
		waitTO:    DefaultWaitTimeout,
		leaseTTL:  DefaultLeaseTTL,
		rebalance: DefaultRebalance,
	}
	bad := func(name, v, want string) error {
		return fmt.Errorf("redisbus: URL %q: %s=%q, want %s: %w", cfg.redacted, name, v, want, driver.ErrInvalid)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("redisbus: URL %q has no host: want redis://[user:password@]host[:port][/db]: %w", cfg.redacted, driver.ErrInvalid)
	}
	q := u.Query()
	ints := []struct {
		name string
		dst  *int
		min  int
	}{
		{"db", &cfg.db, 0},
		{"pool_size", &cfg.poolSize, 1},
		{"max_message_bytes", &cfg.maxBytes, 1},
		{"partitions", &cfg.partitions, 0},
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		if q.Has("db") {
			return nil, fmt.Errorf("redisbus: URL %q: the database is named twice, in the path and in db: %w", cfg.redacted, driver.ErrInvalid)
		}
		q.Set("db", p)
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
	if v := q.Get("maxlen"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, bad("maxlen", v, "an integer >= 0")
		}
		cfg.maxLen = n
	}
	durs := []struct {
		name string
		dst  *time.Duration
		min  time.Duration // 0: 0 allowed
	}{
		{"dial_timeout", &cfg.dialTO, time.Millisecond},
		{"claim_idle", &cfg.claimIdle, minClaimIdle},
		{"max_age", &cfg.maxAge, 0},
		{"wait_timeout", &cfg.waitTO, time.Millisecond},
		{"lease_ttl", &cfg.leaseTTL, minLeaseTTL},
		{"rebalance_interval", &cfg.rebalance, time.Millisecond},
	}
	for _, p := range durs {
		if v := q.Get(p.name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < p.min || d < 0 {
				want := "a duration such as 10s"
				if p.min > 0 {
					want += ", at least " + p.min.String()
				}
				return nil, bad(p.name, v, want)
			}
			*p.dst = d
		}
	}
	useTLS := false
	for name, dst := range map[string]*bool{"trim_unread": &cfg.trimUnread, "tls": &useTLS} {
		if v := q.Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, bad(name, v, "true or false")
			}
			*dst = b
		}
	}
	if v := q.Get("name"); v != "" {
		if strings.ContainsAny(v, " \n\r") {
			return nil, bad("name", v, "a name without spaces")
		}
		cfg.name = v
	}
	if ca := q.Get("tls_ca"); ca != "" || useTLS {
		cfg.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		if ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, fmt.Errorf("redisbus: URL %q: tls_ca: %w: %w", cfg.redacted, err, driver.ErrInvalid)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("redisbus: URL %q: tls_ca %s holds no PEM certificate: %w", cfg.redacted, ca, driver.ErrInvalid)
			}
			cfg.tls.RootCAs = pool
		}
	}
	host := u.Host
	if strings.Contains(host, ",") {
		return nil, fmt.Errorf("redisbus: URL %q: one server only (Redis Cluster and Sentinel are not supported): %w", cfg.redacted, driver.ErrInvalid)
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), DefaultPort)
	}
	cfg.addr = host
	if cfg.tls != nil {
		cfg.tls.ServerName, _, _ = net.SplitHostPort(host)
	}
	if u.User != nil {
		cfg.user = u.User.Username()
		if pw, ok := u.User.Password(); ok {
			cfg.password = pw
		} else {
			// redis://secret@host: a password alone, as redis-cli -u reads it.
			cfg.user, cfg.password = "", cfg.user
		}
	}
	return cfg, nil
}

// ClientOptions returns the go-redis options a redis:// URL connects
// with (server, credentials, database, TLS, client name), for a raw
// go-redis client on the same server: a benchmark's baseline, a test's
// inspection. The parameters of redisbus's own behaviour are checked and
// otherwise ignored.
func ClientOptions(rawURL string) (*redis.Options, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redisbus: URL %q: %w: %w", omnibus.RedactURL(rawURL), err, driver.ErrInvalid)
	}
	q := u.Query()
	q.Del("durability")
	u.RawQuery = q.Encode()
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return cfg.options(), nil
}
