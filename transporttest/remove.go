package transporttest

// Removal: what a transport's own test of DeleteTopic and DeleteGroup
// needs beside its raw client, which checks what the server keeps. Its
// functions run on the test's goroutine.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/omnibus-go/omnibus"
)

// Remover is implemented by a transport's connection that tells whether
// a topic exists and removes a topic, with its messages, and a consumer
// group's state on a topic; a topic or group that does not exist is no
// error. The CLI's bench and demo remove what they made with it.
type Remover interface {
	TopicExists(ctx context.Context, topic string) (bool, error)
	DeleteTopic(ctx context.Context, topic string) error
	DeleteGroup(ctx context.Context, topic, group string) error
}

// ConsumeSome gives the server a topic with messages and a group with
// state on it: a member of group subscribes to topic (from the earliest
// message where the transport replays), n messages are published through
// c, and the member stops once it has handled them all.
func ConsumeSome(t *testing.T, c *omnibus.Client, topic, group string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := omnibus.StartLatest
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest
	}
	var handled atomic.Int64
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
		handled.Add(1)
		return nil
	}, omnibus.Group(group), omnibus.StartFrom(start))
	if err != nil {
		t.Fatalf("Subscribe(%q, group %q): %v", topic, group, err)
	}
	stop := run(t, k)
	msgs := make([]*omnibus.Message, n)
	for i := range msgs {
		msgs[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("m" + strconv.Itoa(i))}
	}
	if err := c.Publish(ctx, topic, msgs...); err != nil {
		t.Fatalf("Publish(%q): %v", topic, err)
	}
	Eventually(t, timeout, func() bool { return handled.Load() >= int64(n) },
		func() string { return "handled " + strconv.FormatInt(handled.Load(), 10) + " of " + strconv.Itoa(n) })
	stop()
}

// Remove removes group and then topic through c's connection, and does
// it again: a second removal finds nothing and is no error. TopicExists
// says the topic is there before, and not after. groupGone, when not
// nil, runs between the first DeleteGroup and DeleteTopic, for the test
// to check with its raw client that the group's state is gone and the
// topic is not.
func Remove(t testing.TB, c *omnibus.Client, topic, group string, groupGone func()) {
	t.Helper()
	r, ok := c.Driver().(Remover)
	if !ok {
		t.Fatalf("the connection %T has no TopicExists, DeleteTopic and DeleteGroup", c.Driver())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	exists := func(want bool, when string) {
		t.Helper()
		if got, err := r.TopicExists(ctx, topic); err != nil || got != want {
			t.Errorf("TopicExists(%q) %s = %v, %v; want %v", topic, when, got, err, want)
		}
	}
	exists(true, "before DeleteTopic")
	defer exists(false, "after DeleteTopic")
	for i, again := range []string{"", " again"} {
		if err := r.DeleteGroup(ctx, topic, group); err != nil {
			t.Fatalf("DeleteGroup(%q, %q)%s: %v", topic, group, again, err)
		}
		if i == 0 && groupGone != nil {
			groupGone()
		}
		if err := r.DeleteTopic(ctx, topic); err != nil {
			t.Fatalf("DeleteTopic(%q)%s: %v", topic, again, err)
		}
	}
}
