package natsbus

// Topics: a topic's stream, created on first use, checked against the
// layout the URL expects (partitioned or not), grown by CreateTopic and
// cached per connection; whether it exists, and deleting it and a
// group's consumers and buckets. It runs on the caller's goroutine
// (Publish, Subscribe, CreateTopic, TopicExists, DeleteTopic,
// DeleteGroup), forget on the fetch loop (a stream gone); conn.mu guards
// the cache.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// streamRef is a topic's stream as this connection knows it.
type streamRef struct {
	name    string
	parts   int       // 0: unpartitioned (the single subject is the topic)
	created time.Time // tells this stream from an earlier one of the same name
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

// streamTimeout bounds each look-up or creation of a stream: a request
// whose connection drops under it gets no answer, and without a bound it
// would wait for as long as ctx lasts. A request that runs out fails
// ErrOutcomeUnknown, which omnibus.Publish rides through.
const streamTimeout = 5 * time.Second

// stream returns the stream of topic, creating it with parts partitions
// (or the URL's default when 0) when it does not exist.
func (c *conn) stream(ctx context.Context, topic string, parts int) (*streamRef, error) {
	c.mu.Lock()
	ref := c.streams[topic]
	c.mu.Unlock()
	if ref != nil {
		return ref, nil
	}
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
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

// groupConsumers returns the durable consumers of group on a stream of
// topic with subjects, whose layout they say (whatever this URL's
// partitions): the group's one consumer, or one per partition. ok is
// false when the subjects are not an omnibus topic's.
func groupConsumers(topic, group string, subjects []string) (consumers []string, ok bool) {
	if len(subjects) == 1 && subjects[0] == topic {
		return []string{safeName(group)}, true
	}
	n := 0
	for n < len(subjects) && slices.Contains(subjects, partitionSubject(topic, n)) {
		n++
	}
	for p := range n {
		consumers = append(consumers, partitionConsumer(group, p))
	}
	return consumers, n > 0
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

// TopicExists reports whether topic's stream exists, read with a stream
// info request; it creates nothing. The CLI uses it to say that a tail
// waits on a new topic, and to keep bench out of a topic in use.
func (c *conn) TopicExists(ctx context.Context, topic string) (bool, error) {
	if err := c.checkOpen("topic", topic); err != nil {
		return false, err
	}
	if err := checkTopic("topic", topic); err != nil {
		return false, err
	}
	_, err := c.js.Stream(ctx, streamName(topic))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return false, nil
	}
	return false, fmt.Errorf("natsbus: topic %q: %w", topic, classify(err))
}

// DeleteTopic deletes topic's stream, with its messages and the durable
// consumers of its groups; a topic without one is no error. The groups'
// KV buckets (positions, leases) live apart from the stream:
// DeleteGroup removes them. The CLI's bench removes the topic it made
// with it.
func (c *conn) DeleteTopic(ctx context.Context, topic string) error {
	if err := c.checkOpen("delete topic", topic); err != nil {
		return err
	}
	if err := checkTopic("delete topic", topic); err != nil {
		return err
	}
	err := c.js.DeleteStream(ctx, streamName(topic))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("natsbus: delete topic %q: %w", topic, classify(err))
	}
	c.forget(topic)
	return nil
}

// DeleteGroup deletes what the server keeps of group on topic: its
// durable consumer (one per partition of a partitioned topic, the
// stream's layout deciding), its positions bucket and its lease bucket.
// A group or topic that does not exist is no error. A member still
// running that finds its consumer gone creates it again with its
// positions bucket, at the stream's first message (the record went with
// the bucket: redeliveries, not a loss); a partitioned member whose
// heartbeat fails creates its lease bucket again (with the TTL it counts
// with), and the lanes whose leases went with the old bucket are lost
// and claimed again. The CLI's bench removes its group with it, after
// its consumers stopped.
func (c *conn) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := c.checkOpen("delete group", topic); err != nil {
		return err
	}
	if err := checkTopic("delete group", topic); err != nil {
		return err
	}
	fail := func(err error) error {
		return fmt.Errorf("natsbus: delete group %q of topic %q: %w", group, topic, classify(err))
	}
	name := streamName(topic)
	// The buckets first: a running member that finds its consumer gone
	// then finds them gone too, and creates them again with it.
	for _, b := range []string{positionBucket(name, group), leaseBucket(name, group)} {
		if err := c.js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fail(fmt.Errorf("bucket %q: %w", b, err))
		}
	}
	st, err := c.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound): // no consumers
	case err != nil:
		return fail(err)
	default:
		consumers, _ := groupConsumers(topic, group, st.CachedInfo().Config.Subjects)
		for _, cn := range consumers {
			if err := st.DeleteConsumer(ctx, cn); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fail(fmt.Errorf("consumer %q: %w", cn, err))
			}
		}
	}
	return nil
}
