package rabbitbus

// Topology: the names of exchanges and queues, declaring them once per
// connection on channels of their own (a failed declaration closes its
// channel), classifying a refusal, the probe for the consistent-hash
// exchange, whether a topic exists, and deleting a topic and a group's
// queues. It runs on the goroutines of Publish, Subscribe, CreateTopic,
// Nack, DeleteTopic and DeleteGroup; conn.mu guards the declaration
// cache, the names declared and the dead-letter topics.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

// CreateTopic implements driver.TopicCreator: it declares the topic's
// exchange (and, for a ".dlq" topic, its dead-letter queue). The number of
// lanes is fixed by the URL's partitions parameter, so lanes is ignored.
func (c *conn) CreateTopic(ctx context.Context, topic string, _ int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	return c.ensureTopic(ctx, topic)
}

// declared is an entry of the declaration cache.
type declared struct {
	gen uint64    // the publish link's connection it was declared on
	at  time.Time // when the declaration was sent
}

// dlqSuffix marks a dead-letter topic: its exchange gets a durable queue
// of the same name bound to it, so dead letters are kept even when no
// consumer group reads the topic.
const dlqSuffix = ".dlq"

func groupQueue(topic, group string) string { return topic + ":" + group }

// kept reports whether group on topic is the dead-letter topic's own
// queue: a group named after a dead-letter topic reads, unpartitioned,
// the queue that keeps the topic's dead letters (the dead-letter tools'
// group, package dlq), rather than a queue of its own that would get
// only what arrives after it.
func (c *conn) kept(topic, group string) bool {
	if group != topic {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead[topic] || strings.HasSuffix(topic, dlqSuffix)
}
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
	if connectionLost(err) {
		// Declarations are idempotent and nothing was published yet.
		return fmt.Errorf("rabbitbus: %s %q: the connection was lost: %w: %w", op, name, err, driver.ErrRetryable)
	}
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

// TopicExists reports whether topic's exchange exists, read with a
// passive declare on a channel of its own; it creates nothing. The CLI
// uses it to say that a tail waits on a new topic, and to keep bench out
// of a topic in use.
func (c *conn) TopicExists(ctx context.Context, topic string) (bool, error) {
	if err := c.checkOpen("topic", topic); err != nil {
		return false, err
	}
	ac, _, err := c.pub.get(ctx)
	if err != nil {
		return false, fmt.Errorf("rabbitbus: topic %q: %w", topic, err)
	}
	ch, err := ac.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitbus: topic %q: %w", topic, err)
	}
	defer ch.Close()
	err = ch.ExchangeDeclarePassive(topic, amqp.ExchangeTopic, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return false, nil
	}
	return false, fmt.Errorf("rabbitbus: topic %q: %w", topic, err)
}

// DeleteTopic deletes topic's exchange and, for a dead-letter topic, the
// queue that keeps its dead letters; a topic that does not exist is no
// error. The groups' queues are bound to the exchange but live apart from
// it, with the messages they hold: DeleteGroup removes them. The CLI's
// bench removes the topic it made with it.
func (c *conn) DeleteTopic(ctx context.Context, topic string) error {
	if err := c.checkOpen("delete topic", topic); err != nil {
		return err
	}
	c.mu.Lock()
	dead := c.dead[topic] || strings.HasSuffix(topic, dlqSuffix)
	c.mu.Unlock()
	_, err := c.withChannel(ctx, c.pub, func(ch *amqp.Channel) error {
		if dead {
			if _, err := ch.QueueDelete(topic, false, false, false); err != nil {
				return err
			}
		}
		return ch.ExchangeDelete(topic, false, false)
	})
	if err != nil {
		return c.topologyError("delete topic", topic, err)
	}
	c.forget("x:" + topic)
	return nil
}

// DeleteGroup deletes group's queues on topic, with the messages they
// hold: its queue, its partition queues, its stream of run records and
// its consistent-hash exchange, whatever layout the URL's partitions say
// (the group may have been made with another: partition queues are
// deleted from 0 up while the server has them), and every retry queue it
// can have. For the group named after a dead-letter topic that is the
// queue keeping the topic's dead letters. Queues that do not exist are
// no error; members still running declare theirs again (the server
// cancels their consumers), and what is published before they have, no
// queue takes: the exchange drops it (with mandatory=true, Publish fails
// with ErrUnroutable). The CLI's bench removes its group with it.
func (c *conn) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := c.checkOpen("delete group", topic); err != nil {
		return err
	}
	retries := allRetryQueues(topic, group)
	_, err := c.withChannel(ctx, c.pub, func(ch *amqp.Channel) error {
		kept := c.kept(topic, group)
		queue := groupQueue(topic, group)
		if kept {
			queue = topic
		}
		for _, q := range append([]string{queue}, retries...) {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return err
			}
		}
		if kept {
			return nil // a dead-letter topic's own queue: never partitioned
		}
		if _, err := ch.QueueDelete(runsQueue(topic, group), false, false, false); err != nil {
			return err
		}
		if err := ch.ExchangeDelete(hashExchange(topic, group), false, false); err != nil {
			return err
		}
		// Last, as the passive declare that finds no queue closes ch.
		for p := range maxPartitions {
			q := partitionQueue(topic, group, p)
			if p >= c.cfg.partitions {
				var ae *amqp.Error
				if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); errors.As(err, &ae) && ae.Code == amqp.NotFound {
					return nil
				} else if err != nil {
					return err
				}
			}
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return c.topologyError(fmt.Sprintf("delete group %q of topic", group), topic, err)
	}
	for _, q := range retries {
		c.forget("q:" + q)
	}
	return nil
}
