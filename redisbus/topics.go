package redisbus

// Topics: a topic's layout (one stream, or a stream per partition and a
// key holding the count), read once per connection and cached, and
// CreateTopic. It runs on the caller's goroutine; conn.mu guards the
// cache.

import (
	"context"
	"fmt"

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
