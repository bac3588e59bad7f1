package bus

// Options of a Bus: its namespace, lane count, codecs, middleware and the
// engine's subscribe options per kind of subscription. Applied once, in New.

import (
	"fmt"

	"github.com/omnibus-go/omnibus"
)

type config struct {
	namespace string
	lanes     int
	codec     Codec
	handlerMW []Middleware
	sendMW    []SendMiddleware
	subAll    []omnibus.SubscribeOption
	subCmd    []omnibus.SubscribeOption
	subEvt    map[string][]omnibus.SubscribeOption
	subReply  []omnibus.SubscribeOption
}

// Option configures a Bus.
type Option func(*config) error

// Namespace starts the name of every topic the bus uses, so several
// applications (or tests) can share a server. Default: "bus".
func Namespace(ns string) Option {
	return func(c *config) error {
		if err := checkName("namespace", ns, true); err != nil {
			return err
		}
		c.namespace = ns
		return nil
	}
}

// Lanes is the lane count of the topics the bus creates
// (omnibus.Client.CreateTopic): what bounds the members of a service's
// group that get work on transports with exclusive lanes. Default: 4.
// Kafka: partitions; NATS (partitions=N): partition subjects; RabbitMQ
// and unpartitioned NATS: ignored (the URL sets the lanes).
func Lanes(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("bus: lanes %d, want at least 1: %w", n, errInvalid)
		}
		c.lanes = n
		return nil
	}
}

// WithCodec sets the codec of message types that are not proto.Message
// (those always use [Protobuf]); the bus also decodes its content type.
// Default: [JSON].
func WithCodec(codec Codec) Option {
	return func(c *config) error {
		if codec == nil || codec.ContentType() == "" {
			return fmt.Errorf("bus: codec without a content type: %w", errInvalid)
		}
		c.codec = codec
		return nil
	}
}

// Use adds handler middleware; see [Middleware] for the order. Default:
// none.
func Use(mw ...Middleware) Option {
	return func(c *config) error {
		c.handlerMW = append(c.handlerMW, mw...)
		return nil
	}
}

// UseSend adds send middleware; see [SendMiddleware] for the order.
// Default: none.
func UseSend(mw ...SendMiddleware) Option {
	return func(c *config) error {
		c.sendMW = append(c.sendMW, mw...)
		return nil
	}
}

// Subscribe passes options to the consumers of the service's commands
// and of every event subscription (retries, dead-letter topic, ordering,
// MaxInFlight, batches, Members...). The bus sets the group last (the
// service's name), so an omnibus.Group here has no effect. Default: the
// engine's defaults.
func Subscribe(opts ...omnibus.SubscribeOption) Option {
	return func(c *config) error {
		c.subAll = append(c.subAll, opts...)
		return nil
	}
}

// SubscribeCommands passes options to the consumer of the service's
// commands, after those of [Subscribe].
func SubscribeCommands(opts ...omnibus.SubscribeOption) Option {
	return func(c *config) error {
		c.subCmd = append(c.subCmd, opts...)
		return nil
	}
}

// SubscribeEvents passes options to the consumer of the events of the
// service from, after those of [Subscribe].
func SubscribeEvents(from string, opts ...omnibus.SubscribeOption) Option {
	return func(c *config) error {
		if err := checkName("service", from, false); err != nil {
			return err
		}
		if c.subEvt == nil {
			c.subEvt = map[string][]omnibus.SubscribeOption{}
		}
		c.subEvt[from] = append(c.subEvt[from], opts...)
		return nil
	}
}

// SubscribeReplies passes options to the instance's consumer of replies.
// The bus sets a throwaway group last. Default: the engine's defaults.
func SubscribeReplies(opts ...omnibus.SubscribeOption) Option {
	return func(c *config) error {
		c.subReply = append(c.subReply, opts...)
		return nil
	}
}
