package kafkabus

// Topics: whether a topic exists, without creating it, and deleting a
// topic and a group's offsets (for the CLI).

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

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

// DeleteTopic deletes topic, with its records, from the cluster; a topic
// that does not exist is no error. What groups committed on it is
// DeleteGroup's. The CLI's bench removes the topic it made with it.
func (c *conn) DeleteTopic(ctx context.Context, topic string) error {
	if err := c.checkOpen("delete topic", topic); err != nil {
		return err
	}
	_, err := c.adm.DeleteTopic(ctx, topic)
	if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("kafkabus: delete topic %q: %w", topic, classify(err))
	}
	c.forget(topic)
	c.mu.Lock()
	producers := c.producers
	c.mu.Unlock()
	for _, p := range producers {
		if p != nil {
			p.PurgeTopicsFromClient(topic)
		}
	}
	c.admin.PurgeTopicsFromClient(topic)
	return nil
}

// DeleteGroup deletes group's committed offsets on topic: the whole group
// when it has offsets on no other topic, else its offsets on topic alone
// (Kafka's OffsetDelete). A group that does not exist is no error; one
// with a member running is, and keeps its offsets: the error wraps
// kerr.NonEmptyGroup (Kafka's GroupNotEmptyException) or, for a group
// with offsets on another topic too, kerr.GroupSubscribedToTopic. The
// CLI's bench removes its group with it.
func (c *conn) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := c.checkOpen("delete group", topic); err != nil {
		return err
	}
	fail := func(err error) error {
		return fmt.Errorf("kafkabus: delete group %q of topic %q: %w", group, topic, classify(err))
	}
	offsets, err := c.adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return nil
	}
	if err != nil {
		return fail(err)
	}
	others := offsets.Partitions()
	mine := others[topic]
	delete(others, topic)
	if len(others) > 0 {
		if len(mine) == 0 {
			return nil
		}
		resp, err := c.adm.DeleteOffsets(ctx, group, kadm.TopicsSet{topic: mine})
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return fail(err)
		}
		return nil
	}
	if _, err := c.adm.DeleteGroup(ctx, group); err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return fail(err)
	}
	return nil
}
