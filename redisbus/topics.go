package redisbus

// Topics: a topic's layout (one stream, or a stream per partition and a
// key holding the count), read once per connection and cached,
// CreateTopic, and deleting a topic's keys and a group's. It runs on the
// caller's goroutine; conn.mu guards the cache.

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// CreateTopic implements driver.TopicCreator. Streams need no creating:
// an unpartitioned topic's stream appears with its first entry or group.
// A partitioned connection records lanes partitions for a new topic, and
// grows an existing one to lanes (keys then map differently, as on
// Kafka).
func (c *conn) CreateTopic(ctx context.Context, topic string, lanes int) error {
	if err := c.checkOpen("create topic", topic); err != nil {
		return err
	}
	if c.cfg.partitions == 0 {
		_, err := c.layout(ctx, topic)
		return err
	}
	_, err := c.readLayout(ctx, topic, max(lanes, 1), true)
	return err
}

// TopicExists reports whether topic has a stream (or, partitioned, a
// recorded layout).
func (c *conn) TopicExists(ctx context.Context, topic string) (bool, error) {
	if err := c.checkOpen("topic exists", topic); err != nil {
		return false, err
	}
	n, err := c.rdb.Exists(ctx, topic, layoutKey(topic)).Result()
	if err != nil {
		return false, fmt.Errorf("redisbus: topic exists %q: %w", topic, classify(err))
	}
	return n > 0, nil
}

// layout returns topic's partition count (0: unpartitioned), read on the
// connection's first use of the topic. A topic whose layout does not
// match the URL's mode is an error wrapping ErrInvalid.
func (c *conn) layout(ctx context.Context, topic string) (int, error) {
	c.mu.Lock()
	n, ok := c.layouts[topic]
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	return c.readLayout(ctx, topic, c.cfg.partitions, false)
}

func (c *conn) readLayout(ctx context.Context, topic string, want int, grow bool) (int, error) {
	g := "0"
	if grow {
		g = "1"
	}
	n, err := layoutScript.Run(ctx, c.rdb, []string{layoutKey(topic), topic}, want, g).Int()
	switch {
	case err != nil:
		return 0, fmt.Errorf("redisbus: topic %q: layout: %w", topic, classify(err))
	case n < 0:
		return 0, fmt.Errorf("redisbus: topic %q is unpartitioned (a stream at key %q): open it without partitions: %w", topic, topic, driver.ErrInvalid)
	case n > 0 && want == 0:
		return 0, fmt.Errorf("redisbus: topic %q has %d partitions (key %q): open it with partitions=%d: %w", topic, n, layoutKey(topic), n, driver.ErrInvalid)
	}
	c.mu.Lock()
	c.layouts[topic] = n
	c.mu.Unlock()
	return n, nil
}

// DeleteTopic deletes topic's streams (its one stream, or a stream per
// partition), with their entries and the groups on them, its layout key
// and its groups' positions; a topic that does not exist is no error.
// Each group's other keys (members, fencing counter, run counts, leases)
// are DeleteGroup's, which needs the layout: delete the groups first. The
// CLI's bench removes the topic it made with it.
func (c *conn) DeleteTopic(ctx context.Context, topic string) error {
	if err := c.checkOpen("delete topic", topic); err != nil {
		return err
	}
	parts, err := c.storedLayout(ctx, topic)
	if err == nil {
		keys := append(streamsOf(topic, parts), layoutKey(topic), positionsKey(topic))
		err = c.rdb.Del(ctx, keys...).Err()
	}
	if err != nil {
		return fmt.Errorf("redisbus: delete topic %q: %w", topic, classify(err))
	}
	c.mu.Lock()
	delete(c.layouts, topic)
	c.mu.Unlock()
	return nil
}

// DeleteGroup removes group from topic's streams (XGROUP DESTROY, which
// drops its pending entries) and deletes its keys: its members, fencing
// counter, positions, run counts and leases. A group or topic that does
// not exist is no error; members still running would create the group
// again. The CLI's bench removes its group with it.
func (c *conn) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := c.checkOpen("delete group", topic); err != nil {
		return err
	}
	parts, err := c.storedLayout(ctx, topic)
	if err == nil {
		err = c.destroyGroup(ctx, topic, parts, group)
	}
	if err != nil {
		return fmt.Errorf("redisbus: delete group %q of topic %q: %w", group, topic, classify(err))
	}
	return nil
}

// storedLayout reads topic's partition count from its layout key (0:
// unpartitioned, or no topic), whatever this URL's partitions.
func (c *conn) storedLayout(ctx context.Context, topic string) (int, error) {
	n, err := c.rdb.Get(ctx, layoutKey(topic)).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}
