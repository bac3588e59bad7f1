package natsbus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

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
