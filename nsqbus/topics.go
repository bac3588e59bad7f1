package nsqbus

// Topics: whether a topic exists, deleting a topic from every nsqd, and
// a group's channel, through nsqd's HTTP API. It runs on the caller's
// goroutine.

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/omnibus-go/omnibus/driver"
)

// TopicExists reports whether an nsqd holds topic (in lookup mode, one
// registered with nsqlookupd for it), as its /stats says.
func (c *conn) TopicExists(ctx context.Context, topic string) (bool, error) {
	if err := c.checkOpen("topic exists", topic); err != nil {
		return false, err
	}
	fail := func(err error) (bool, error) { return false, fmt.Errorf("nsqbus: topic exists %q: %w", topic, err) }
	nsqTop, err := topicName(topic)
	if err != nil {
		return fail(err)
	}
	exists := false
	err = c.eachStats(ctx, nsqTop, "", func(_ node, st *statsReply) {
		for _, t := range st.Topics {
			exists = exists || t.Name == nsqTop
		}
	})
	if err != nil {
		return fail(err)
	}
	return exists, nil
}

// DeleteTopic deletes topic, with its channels and the messages they
// hold, from every nsqd (in lookup mode every nsqd registered with
// nsqlookupd, which each nsqd tells); a topic that does not exist is no
// error. The CLI's bench removes the topics it made with it.
func (c *conn) DeleteTopic(ctx context.Context, topic string) error {
	if err := c.checkOpen("delete topic", topic); err != nil {
		return err
	}
	nsqTop, err := topicName(topic)
	if err == nil {
		err = c.postEach(ctx, "", "/topic/delete", url.Values{"topic": {nsqTop}})
	}
	if err != nil {
		return fmt.Errorf("nsqbus: delete topic %q: %w", topic, err)
	}
	return nil
}

// DeleteGroup deletes group's channel of topic, with the messages it
// holds, from every nsqd that has the topic: the channel of the group's
// name, and its ephemeral one. A group or topic that does not exist is
// no error; members still running would create the channel again. The
// CLI's bench removes its group with it.
func (c *conn) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := c.checkOpen("delete group", topic); err != nil {
		return err
	}
	fail := func(err error) error {
		return fmt.Errorf("nsqbus: delete group %q of topic %q: %w", group, topic, err)
	}
	nsqTop, err := topicName(topic)
	if err != nil {
		return fail(err)
	}
	for _, ephemeral := range []bool{false, true} {
		channel, err := channelName(group, ephemeral)
		if err == nil {
			err = c.postEach(ctx, nsqTop, "/channel/delete", url.Values{"topic": {nsqTop}, "channel": {channel}})
		}
		if err != nil {
			return fail(err)
		}
	}
	return nil
}

// postEach calls POST path on the HTTP API of every nsqd holding topic
// (every nsqd when topic is ""); an answer of not found is no error.
func (c *conn) postEach(ctx context.Context, topic, path string, query url.Values) error {
	nodes, err := c.nodes(ctx, topic)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := c.post(ctx, n.http, path, query); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return fmt.Errorf("nsqd %s: %w", n.http, err)
		}
	}
	return nil
}
