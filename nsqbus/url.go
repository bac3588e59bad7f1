package nsqbus

// The URL: its parameters, their defaults, and parsing into a config.
// Parsing runs on the caller's goroutine (Open); a config is not written
// once parsed, so no lock guards it.

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the URL parameters.
const (
	DefaultMsgTimeout   = 60 * time.Second // nsqd's --msg-timeout
	DefaultPollInterval = 5 * time.Second
	DefaultDialTimeout  = 5 * time.Second
	// DefaultPort is nsqd's TCP port, and DefaultLookupPort nsqlookupd's
	// HTTP port: a host without a port gets the one of its mode.
	DefaultPort       = 4150
	DefaultLookupPort = 4161
)

var params = []string{"lookup", "http_port", "msg_timeout", "max_message_bytes", "poll_interval", "dial_timeout", "envelope",
	"output_buffer_size", "output_buffer_timeout"}

// config is a parsed URL.
type config struct {
	redacted string   // the URL as errors show it
	lookup   bool     // hosts are nsqlookupd HTTP addresses
	hosts    []string // host:port, in the URL's order
	httpPort int      // direct mode: nsqd's HTTP port; 0 = each host's TCP port + 1
	secret   string   // nsqd's AUTH secret, "" for none
	msgTO    time.Duration
	maxBytes int // 0: ask the server
	poll     time.Duration
	dialTO   time.Duration
	binary   bool // envelope=binary: publish in the binary envelope (binary.go)
	// What nsqd buffers before it writes to a consumer (IDENTIFY
	// output_buffer_size and output_buffer_timeout); 0 leaves go-nsq's
	// (16384 bytes, 250ms). Without either in the URL, outSize is -1:
	// no buffer.
	outSize    int
	outTimeout time.Duration
}

func parseConfig(u *url.URL) (*config, error) {
	if err := driver.CheckParams(u, params...); err != nil {
		return nil, fmt.Errorf("nsqbus: %w", err)
	}
	cfg := &config{
		redacted: omnibus.RedactURL(u.String()),
		msgTO:    DefaultMsgTimeout,
		poll:     DefaultPollInterval,
		dialTO:   DefaultDialTimeout,
	}
	bad := func(name, v, want string) error {
		return fmt.Errorf("nsqbus: URL %q: %s=%q, want %s: %w", cfg.redacted, name, v, want, driver.ErrInvalid)
	}
	q := u.Query()
	if v := q.Get("lookup"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, bad("lookup", v, "true or false")
		}
		cfg.lookup = b
	}
	for name, dst := range map[string]*int{"http_port": &cfg.httpPort, "max_message_bytes": &cfg.maxBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || (name == "http_port" && n > 65535) {
				return nil, bad(name, v, "a positive integer")
			}
			*dst = n
		}
	}
	switch v := q.Get("envelope"); v {
	case "", "json":
	case "binary":
		cfg.binary = true
	default:
		return nil, bad("envelope", v, "json or binary")
	}
	if cfg.lookup && cfg.httpPort != 0 {
		return nil, fmt.Errorf("nsqbus: URL %q: http_port is for nsqd addresses; nsqlookupd tells each nsqd's HTTP port: %w", cfg.redacted, driver.ErrInvalid)
	}
	if v := q.Get("output_buffer_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != -1 && n < 64) {
			return nil, bad("output_buffer_size", v, "-1 (no buffer) or at least 64 (bytes; nsqd's bounds)")
		}
		cfg.outSize = n
	}
	if v := q.Get("output_buffer_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Millisecond {
			return nil, bad("output_buffer_timeout", v, "a duration of at least 1ms (nsqd's --min-output-buffer-timeout, 25ms by default, bounds it)")
		}
		if cfg.outSize == -1 {
			return nil, bad("output_buffer_timeout", v, "nothing with output_buffer_size=-1 (no buffer to flush)")
		}
		cfg.outTimeout = d
	}
	if cfg.outSize == 0 && cfg.outTimeout == 0 {
		cfg.outSize = -1 // nsqd writes each message to a consumer at once
	}
	for name, dst := range map[string]*time.Duration{"msg_timeout": &cfg.msgTO, "poll_interval": &cfg.poll, "dial_timeout": &cfg.dialTO} {
		if v := q.Get(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 10*time.Millisecond {
				return nil, bad(name, v, "a duration of at least 10ms, such as 5s")
			}
			*dst = d
		}
	}
	if cfg.msgTO < time.Second {
		return nil, bad("msg_timeout", cfg.msgTO.String(), "at least 1s (nsqd counts it in milliseconds, and TOUCH needs time)")
	}
	if cfg.poll > 5*time.Minute {
		return nil, bad("poll_interval", cfg.poll.String(), "at most 5m (go-nsq's bound)")
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("nsqbus: URL %q has no host: want nsq://host:4150 or nsq://lookupd:4161?lookup=true: %w", cfg.redacted, driver.ErrInvalid)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("nsqbus: URL %q: a path means nothing to NSQ (topics are named on Publish and Subscribe): %w", cfg.redacted, driver.ErrInvalid)
	}
	if u.User != nil {
		// The secret alone (nsq://SECRET@host) or as the password
		// (nsq://:SECRET@host); either way it is hidden in errors.
		cfg.secret = u.User.Username()
		if p, ok := u.User.Password(); ok {
			cfg.secret = p
		}
	}
	port := DefaultPort
	if cfg.lookup {
		port = DefaultLookupPort
	}
	for h := range strings.SplitSeq(u.Host, ",") {
		if h == "" {
			return nil, fmt.Errorf("nsqbus: URL %q: an empty host in the list: %w", cfg.redacted, driver.ErrInvalid)
		}
		host, p, err := net.SplitHostPort(h)
		if err != nil {
			// No port (or a bare IPv6 address in brackets).
			host, p = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), strconv.Itoa(port)
		}
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || host == "" {
			return nil, fmt.Errorf("nsqbus: URL %q: host %q, want host:port: %w", cfg.redacted, h, driver.ErrInvalid)
		}
		cfg.hosts = append(cfg.hosts, net.JoinHostPort(host, p))
	}
	return cfg, nil
}

// httpAddr is the HTTP address of the nsqd at tcpAddr, in direct mode.
func (c *config) httpAddr(tcpAddr string) string {
	host, p, _ := net.SplitHostPort(tcpAddr)
	port := c.httpPort
	if port == 0 {
		n, _ := strconv.Atoi(p)
		port = n + 1
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}
