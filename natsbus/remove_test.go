package natsbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
			c := open(t, base+params)
			topic, group := topicName(t, base), "g-"+name
			if err := c.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			transporttest.ConsumeSome(t, c, topic, group, 30)

			nc, err := nats.Connect(base, nats.Timeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream := natsbus.StreamName(topic)
			messages := func() (uint64, error) {
				s, err := js.Stream(ctx, stream)
				if err != nil {
					return 0, err
				}
				return s.CachedInfo().State.Msgs, nil
			}
			// state is what the server keeps of the group: its consumers
			// on the stream, and its buckets.
			state := func() []string {
				t.Helper()
				var have []string
				if s, err := js.Stream(ctx, stream); err == nil {
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
