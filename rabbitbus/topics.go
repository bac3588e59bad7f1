package rabbitbus

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
