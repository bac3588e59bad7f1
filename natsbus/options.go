package natsbus

// The typed configuration: New and its options, for what a URL cannot
// carry (a *tls.Config, nats.go's own options, a connection of the
// caller's). Read-only once New returns.

import (
	"crypto/tls"
	"fmt"
	"net/url"

	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus/driver"
)

// Option configures a Driver made by New.
type Option func(*Driver)

// New returns a natsbus driver configured in Go, for
// omnibus.WithDriver: the URL still names the server and sets every
// parameter, and the options add what a URL cannot carry.
//
//	d := natsbus.New(natsbus.WithTLS(tlsConfig), natsbus.WithOptions(nats.UserJWT(jwtFn, signFn)))
//	c, err := omnibus.Open(ctx, "nats://nats1:4222,nats2:4222", omnibus.WithDriver(d))
func New(opts ...Option) Driver {
	var d Driver
	for _, o := range opts {
		o(&d)
	}
	return d
}

// WithTLS sets the TLS configuration of the connection and turns TLS on.
// It takes the place of the URL's tls parameters, which are then an
// error. When its ServerName is empty, the connection verifies the host
// it dials. Default: none (the URL's tls parameters). NATS: nats.Secure.
func WithTLS(cfg *tls.Config) Option {
	return func(d *Driver) { d.tls = cfg }
}

// WithOptions adds nats.go options to the connection natsbus makes,
// after the ones the URL becomes, so they win: nats.UserJWT or nats.Nkey
// with a signer of your own (a key that never leaves an HSM),
// nats.SetCustomDialer, nats.ProxyPath, the connection's handlers (which
// then replace natsbus's, which log disconnections and asynchronous
// errors). Default: none.
func WithOptions(opts ...nats.Option) Option {
	return func(d *Driver) { d.natsOpts = append(d.natsOpts, opts...) }
}

// WithConn makes natsbus use a connection of the caller's instead of
// dialing one. The caller keeps it: closing the client leaves it open.
// The URL's host is not dialed (it names the client in errors and
// logs); credentials and the parameters that shape a connection (name,
// tls, tls_*, creds, nkey, reconnect_wait, max_reconnects) are an error
// with it, and so are WithTLS and WithOptions. connect_timeout bounds
// Open's check that JetStream answers. Default: none (natsbus dials).
func WithConn(nc *nats.Conn) Option {
	return func(d *Driver) { d.nc = nc }
}

// connParams are the URL parameters that shape a connection natsbus
// dials.
var connParams = []string{"name", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "creds", "nkey", "reconnect_wait", "max_reconnects"}

// check refuses what the URL says that the options take the place of.
func (d Driver) check(u *url.URL, cfg *config) error {
	bad := func(what string) error {
		return fmt.Errorf("natsbus: URL %q: %s: %w", cfg.redacted, what, driver.ErrInvalid)
	}
	q := u.Query()
	switch {
	case d.nc != nil && cfg.embedded:
		return bad("WithConn takes a connection to a server, not nats://embedded")
	case d.nc != nil && (d.tls != nil || len(d.natsOpts) > 0):
		return bad("WithConn's connection is made: WithTLS and WithOptions cannot shape it")
	case d.nc != nil && u.User != nil:
		return bad("credentials with WithConn: the connection has logged in already")
	case d.tls != nil && cfg.embedded:
		return bad("WithTLS: clients in the process reach the embedded server without TLS")
	}
	for _, p := range connParams {
		switch {
		case d.nc != nil && q.Has(p):
			return bad(p + " with WithConn: the connection is made already")
		case d.tls != nil && p != "name" && len(p) >= 3 && p[:3] == "tls" && q.Has(p):
			return bad(p + " and WithTLS: the TLS configuration is WithTLS's")
		}
	}
	return nil
}
