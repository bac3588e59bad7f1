package rabbitbus

// The typed configuration: New and its options, for what a URL cannot
// carry (a *tls.Config, amqp091-go's own configuration). Read-only once
// New returns.

import (
	"crypto/tls"
	"fmt"
	"net/url"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// Option configures a Driver made by New.
type Option func(*Driver)

// New returns a rabbitbus driver configured in Go, for
// omnibus.WithDriver: the URL still names the server and sets every
// parameter, and the options add what a URL cannot carry.
//
//	d := rabbitbus.New(rabbitbus.WithTLS(tlsConfig),
//		rabbitbus.WithConfig(amqp.Config{SASL: []amqp.Authentication{&amqp.ExternalAuth{}}}))
//	c, err := omnibus.Open(ctx, "amqps://rabbit1:5671/", omnibus.WithDriver(d))
//
// rabbitbus takes a configuration, not an *amqp.Connection: it dials
// two connections (one to publish, one to consume, as RabbitMQ advises)
// and dials again after either drops, so it needs to know how to dial.
func New(opts ...Option) Driver {
	var d Driver
	for _, o := range opts {
		o(&d)
	}
	return d
}

// WithTLS sets the TLS configuration of both connections, which needs
// the amqps scheme. It takes the place of the URL's tls parameters,
// which are then an error. When its ServerName is empty, the
// connections verify the URL's host. Default: none (the URL's tls
// parameters). amqp091-go: Config.TLSClientConfig.
func WithTLS(cfg *tls.Config) Option {
	return func(d *Driver) { d.tls = cfg }
}

// WithConfig sets amqp091-go's configuration of both connections: SASL
// (which takes the place of the URL's user and password:
// amqp.ExternalAuth logs in with the client certificate), Dial (called
// for every connection; connect_timeout and Open's context still bound
// the handshake after it), Properties (over rabbitbus's, which name the
// connection "omnibus"), ChannelMax, FrameSize, Locale. The fields the
// URL and rabbitbus set are an error when set here: Vhost (the URL's
// path), Heartbeat (heartbeat), TLSClientConfig (WithTLS) and Recovery
// (rabbitbus reconnects itself). Default: amqp091-go's defaults and the
// URL's values.
func WithConfig(cfg amqp.Config) Option {
	return func(d *Driver) { d.amqp = &cfg }
}

// tlsParams are the URL parameters of TLS.
var tlsParams = []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure"}

// apply puts the driver's options into cfg, parsed from u, refusing
// what the URL or rabbitbus sets already.
func (d Driver) apply(u *url.URL, cfg *config) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("rabbitbus: URL %q: %s: %w", cfg.redacted, fmt.Sprintf(format, args...), driver.ErrInvalid)
	}
	if d.tls != nil {
		if u.Scheme != SchemeTLS {
			return bad("WithTLS needs the %s scheme", SchemeTLS)
		}
		for _, p := range tlsParams {
			if u.Query().Has(p) {
				return bad("%s and WithTLS: the TLS configuration is WithTLS's", p)
			}
		}
		tc := d.tls.Clone() // amqp091-go writes ServerName into the one it is given
		if tc.ServerName == "" {
			tc.ServerName = u.Hostname()
		}
		cfg.amqp.TLSClientConfig = tc
	}
	a := d.amqp
	if a == nil {
		return nil
	}
	switch {
	case a.Vhost != "":
		return bad("WithConfig's Vhost: the virtual host is the URL's path")
	case a.Heartbeat != 0:
		return bad("WithConfig's Heartbeat: the heartbeat is the URL's heartbeat parameter")
	case a.TLSClientConfig != nil:
		return bad("WithConfig's TLSClientConfig: give it with WithTLS")
	case a.Recovery != nil:
		return bad("WithConfig's Recovery: rabbitbus reconnects and declares its topology again itself")
	}
	cfg.amqp.SASL, cfg.amqp.ChannelMax, cfg.amqp.FrameSize, cfg.amqp.Locale = a.SASL, a.ChannelMax, a.FrameSize, a.Locale
	cfg.userDial = a.Dial
	for k, v := range a.Properties {
		cfg.amqp.Properties[k] = v
	}
	return nil
}
