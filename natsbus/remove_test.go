package natsbus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a topic,
// unpartitioned and partitioned, DeleteGroup removes the group's durable
// consumers and KV buckets and leaves the stream with its messages;
// DeleteTopic removes the stream, as a raw jetstream client sees them;
// removing them again is no error.
func TestDeleteTopicAndGroup(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": "?" + partitionedParams} {
		t.Run(name, func(t *testing.T) {
			base := externalURL(t)
			c := transporttest.Open(t, base+params)
			topic, group := topicName(t, base), "g-"+name
			if err := c.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			transporttest.ConsumeSome(t, c, topic, group, 30)

			js, ctx := rawJetStream(t, base), t.Context()
			stream := natsbus.StreamName(topic)
			messages := func() (uint64, error) {
				s, err := js.Stream(ctx, stream)
				if err != nil {
					return 0, err
				}
				return s.CachedInfo().State.Msgs, nil
			}
			state := func() []string { return groupState(t, js, topic, group) }
			want := 2 // the consumer and the positions bucket
			if params != "" {
				want = 3 + 2 // a consumer per partition, and the lease bucket too
			}
			if n, err := messages(); n != 30 || len(state()) != want {
				t.Fatalf("before removal: the stream holds %d messages (%v), the group %v; want 30 and %d things", n, err, state(), want)
			}
			transporttest.Remove(t, c, topic, group, func() {
				if n, err := messages(); n != 30 || len(state()) != 0 {
					t.Errorf("after DeleteGroup: the stream holds %d messages (%v), the group %v; want 30 and nothing", n, err, state())
				}
			})
			if _, err := messages(); !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("after DeleteTopic, the stream: %v; want it not found", err)
			}
		})
	}
}

// TestDeleteGroupWithMember: DeleteGroup under a running member,
// unpartitioned and partitioned, deletes the group's consumers and
// buckets; the member creates them again and loses nothing published
// after (the stream keeps it); once the member stopped, DeleteGroup
// leaves nothing of the group, as a raw jetstream client sees it. The
// partitioned member's test publishes once the member holds every
// partition's lease again, in a lease bucket of its making.
func TestDeleteGroupWithMember(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": "?" + partitionedParams} {
		t.Run(name, func(t *testing.T) {
			base := externalURL(t)
			c := transporttest.Open(t, base+params)
			topic, group := topicName(t, base), "busy-"+name
			if err := c.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			js := rawJetStream(t, base)
			var back func() bool
			if params != "" {
				back = func() bool {
					kv, err := js.KeyValue(t.Context(), natsbus.LeaseBucket(topic, group))
					if err != nil {
						return false
					}
					keys, err := kv.Keys(t.Context())
					return err == nil && slices.Contains(keys, "p.0") && slices.Contains(keys, "p.1") && slices.Contains(keys, "p.2")
				}
			}
			transporttest.DeleteUnderMember(t, c, topic, group, 30, transporttest.Busy{
				Back: back,
				Gone: func() {
					have := groupState(t, js, topic, group)
					if len(have) > 0 {
						t.Errorf("after DeleteGroup of the stopped member: %v left; want nothing", have)
					}
				},
			})
		})
	}
}

// TestPositionsBucketDeletedUnderMember: the positions bucket of an
// unpartitioned group deleted behind a running member's back (its
// consumer left alone) is created again by the member, which records the
// group's position there again and goes on consuming.
func TestPositionsBucketDeletedUnderMember(t *testing.T) {
	base := externalURL(t)
	c := transporttest.Open(t, base)
	topic, group := topicName(t, base), "kept"
	if err := c.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	js, ctx := rawJetStream(t, base), t.Context()
	bucket := natsbus.PositionBucket(topic, group)
	t.Cleanup(func() {
		r := c.Driver().(transporttest.Remover)
		_ = r.DeleteGroup(context.Background(), topic, group)
		_ = r.DeleteTopic(context.Background(), topic)
	})

	var handled atomic.Int64
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
		handled.Add(1)
		return nil
	}, omnibus.Group(group), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- k.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		<-ran
	})
	publish := func(n int) {
		for range n {
			if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// recorded waits until the bucket exists and holds a position above
	// after: the keeper records every 5 seconds.
	recorded := func(after uint64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var why error
			if kv, err := js.KeyValue(ctx, bucket); err != nil {
				why = err
			} else if e, err := kv.Get(ctx, "p.0"); err != nil {
				why = err
			} else if e.Revision() <= after {
				why = errors.New("not recorded again")
			} else {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the group's position in bucket %q: %v", bucket, why)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	publish(10)
	recorded(0)
	if err := js.DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	recorded(0)
	publish(10)
	deadline := time.Now().Add(15 * time.Second)
	for handled.Load() < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of 20 messages", handled.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// groupState is what the server keeps of group on topic, as js sees it:
// its consumers on the stream, and its buckets.
func groupState(t *testing.T, js jetstream.JetStream, topic, group string) []string {
	t.Helper()
	ctx := t.Context()
	var have []string
	if s, err := js.Stream(ctx, natsbus.StreamName(topic)); err == nil {
		names := s.ConsumerNames(ctx)
		for n := range names.Name() {
			if n == group || strings.HasPrefix(n, group+"_p") {
				have = append(have, "consumer "+n)
			}
		}
		if err := names.Err(); err != nil {
			t.Fatal(err)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
	for _, b := range []string{natsbus.PositionBucket(topic, group), natsbus.LeaseBucket(topic, group)} {
		_, err := js.KeyValue(ctx, b)
		switch {
		case err == nil:
			have = append(have, "bucket "+b)
		case !errors.Is(err, jetstream.ErrBucketNotFound):
			t.Fatal(err)
		}
	}
	return have
}
