package kafkabus

// Topics: whether a topic exists, without creating it (for the CLI).

import (
	"context"
	"errors"
	"fmt"

	"github.com/omnibus-go/omnibus/driver"
)

// TopicExists reports whether topic exists on the cluster, read with a
// metadata request; it creates nothing. The CLI uses it to say that a
// tail waits on a new topic, and to keep bench out of a topic in use.
func (c *conn) TopicExists(ctx context.Context, topic string) (bool, error) {
	if err := c.checkOpen("topic", topic); err != nil {
		return false, err
	}
	_, err := c.partitionCount(ctx, topic)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, driver.ErrNotFound):
		return false, nil
	}
	return false, fmt.Errorf("kafkabus: topic %q: %w", topic, err)
}
