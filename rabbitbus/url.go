package rabbitbus

// The URL: its parameters, their defaults, and parsing into a config,
// TLS included. Parsing runs on the caller's goroutine (Open); a config
// is not written once parsed, so no lock guards it.

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

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// Defaults of the URL parameters.
const (
	DefaultQueueType       = "classic"
	DefaultMaxMessageBytes = 128 << 20 // RabbitMQ 3.10's max_message_size
	DefaultHeartbeat       = 10 * time.Second
	DefaultConnectTimeout  = 30 * time.Second
	DefaultRebalance       = 2 * time.Second
)

// maxPartitions bounds the URL's partitions.
const maxPartitions = 1024

var params = []string{
	"queue_type", "partitions", "mandatory", "max_message_bytes", "heartbeat",
	"connect_timeout", "rebalance", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure",
}

// config is a parsed URL.
type config struct {
	url        string // without query, with credentials: for dialing only
	redacted   string // the URL as errors show it
	user       string
	vhost      string
	amqp       amqp.Config
	userDial   func(network, addr string) (net.Conn, error) // WithConfig's Dial
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
			if err != nil || n < 1 || (name == "partitions" && n > maxPartitions) {
				return nil, bad(name, v, fmt.Sprintf("a positive integer (partitions at most %d)", maxPartitions))
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
		for _, p := range tlsParams {
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
	if _, hasPass := u.User.Password(); (hasPass || u.User == nil) && redact.ShowName(uri.Username) {
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
