package transporttest

// Removal: what a transport's own test of DeleteTopic and DeleteGroup
// needs beside its raw client, which checks what the server keeps. Its
// functions run on the test's goroutine.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
	stop := RunConsumer(t, k)
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

// Busy is what a transport's DeleteGroup promises for a group with a
// member running, for DeleteUnderMember to check.
type Busy struct {
	// Refused, when set, is the transport's refusal: DeleteGroup with a
	// member running must return an error it accepts, and leave the
	// group as it was (Kafka: GroupNotEmpty). When nil, DeleteGroup must
	// delete the group under the member and return nil.
	Refused func(err error) bool
	// Deleted, when set, runs after that first DeleteGroup, the member
	// still running, for the test to check with its raw client what the
	// server has of the group (Kafka: the committed offsets are all
	// there).
	Deleted func()
	// Back, when set, tells whether the member has its state on the
	// server again after the deletion; messages are published once it
	// does. It is for a transport whose server drops what arrives while
	// the group has no state to take it (RabbitMQ: a message no queue
	// takes), a window the member's re-declaring closes. Without it,
	// messages are published at once, and none may be lost.
	Back func() bool
	// Gone runs after the member stopped and DeleteGroup ran again, for
	// the test to check with its raw client that nothing of the group is
	// left on the server.
	Gone func()
}

// DeleteUnderMember deletes group's state on topic through c's
// connection while a member of group runs: the member handles n
// messages, DeleteGroup runs (refused, or deleting the group, as b
// says), n more are published, and the member must handle every one of
// them (messages it had handled may come again). Then the member stops,
// and DeleteGroup, run again, must succeed and leave nothing (b.Gone).
// The group and the topic are removed at cleanup whatever happens.
func DeleteUnderMember(t *testing.T, c *omnibus.Client, topic, group string, n int, b Busy) {
	t.Helper()
	r, ok := c.Driver().(Remover)
	if !ok {
		t.Fatalf("the connection %T has no TopicExists, DeleteTopic and DeleteGroup", c.Driver())
	}
	t.Cleanup(func() { // after the member's own cleanup, which stops it
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := r.DeleteGroup(ctx, topic, group); err != nil {
			t.Errorf("cleanup: DeleteGroup(%q, %q): %v", topic, group, err)
		}
		if err := r.DeleteTopic(ctx, topic); err != nil {
			t.Errorf("cleanup: DeleteTopic(%q): %v", topic, err)
		}
	})
	ctx := ctxT(t)
	col := newCollector()
	start := omnibus.StartLatest
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest
	}
	k, err := c.Subscribe(ctx, topic, col.handler, omnibus.Group(group), omnibus.StartFrom(start))
	if err != nil {
		t.Fatalf("Subscribe(%q, group %q): %v", topic, group, err)
	}
	stop := RunConsumer(t, k)
	col.await(t, publishN(t, c, topic, n, 4, 8))
	awaitNoLag(t, k) // settled and committed: the group has its state

	err = r.DeleteGroup(ctx, topic, group)
	switch {
	case b.Refused == nil && err != nil:
		t.Fatalf("DeleteGroup(%q, %q) with a member running: %v; want it deleted under the member", topic, group, err)
	case b.Refused != nil && !b.Refused(err):
		t.Errorf("DeleteGroup(%q, %q) with a member running: %v; want it refused", topic, group, err)
	}
	if b.Deleted != nil {
		b.Deleted()
	}
	if b.Back != nil {
		Eventually(t, 15*time.Second, b.Back, func() string { return "the member did not declare its state again" })
	}
	col.awaitWithin(t, 15*time.Second, publishN(t, c, topic, n, 4, 8))
	stop()

	if err := r.DeleteGroup(ctx, topic, group); err != nil {
		t.Fatalf("DeleteGroup(%q, %q) after the member stopped: %v", topic, group, err)
	}
	if b.Gone != nil {
		b.Gone()
	}
}
