package kafkabus

// The typed configuration: New and its options, for what a URL cannot
// carry (a *tls.Config, franz-go's own options). Read-only once New
// returns.

import (
	"crypto/tls"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Option configures a Driver made by New.
type Option func(*Driver)

// New returns a kafkabus driver configured in Go, for
// omnibus.WithDriver: the URL still names the brokers and sets every
// parameter, and the options add what a URL cannot carry.
//
//	d := kafkabus.New(kafkabus.WithTLS(tlsConfig), kafkabus.WithClientOpts(kgo.SASL(mechanism)))
//	c, err := omnibus.Open(ctx, "kafkas://broker1:9098,broker2:9098", omnibus.WithDriver(d))
//
// kafkabus takes options, not a *kgo.Client: it makes several clients
// (an admin client, a producer per durability, a client per group
// member, since a franz-go client is at most one group member), and
// every one of them gets the options.
func New(opts ...Option) Driver {
	var d Driver
	for _, o := range opts {
		o(&d)
	}
	return d
}

// WithTLS sets the TLS configuration of every connection to the brokers
// and turns TLS on, as the kafkas scheme does. It takes the place of the
// URL's tls parameters, which are then an error. When its ServerName is
// empty, each connection verifies the host it dials. Default: none (the
// URL's tls parameters). Kafka: security.protocol SSL and the ssl.*
// settings; franz-go: kgo.DialTLSConfig.
func WithTLS(cfg *tls.Config) Option {
	return func(d *Driver) { d.tls = cfg }
}

// WithClientOpts adds franz-go options to every client kafkabus makes
// (the admin client, the producers, each group member), after the
// options the URL's connection parameters become, so they replace
// those: a SASL mechanism the URL cannot name (kgo.SASL with OAUTHBEARER
// or AWS_MSK_IAM; leave the user out of the URL then), kgo.Dialer,
// kgo.WithHooks, kgo.WithLogger. The options kafkabus sets for a role
// come after them and stay the URL's: a producer's acks, idempotence,
// linger, compression and batching; a member's group, topic, balancer,
// commits and fetch sizes. Default: none.
func WithClientOpts(opts ...kgo.Opt) Option {
	return func(d *Driver) { d.clientOpts = append(d.clientOpts, opts...) }
}
