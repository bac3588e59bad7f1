package redisbus_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a topic,
// unpartitioned and partitioned, DeleteGroup removes the group from the
// topic's streams and deletes its keys, leaving the streams with their
// entries; DeleteTopic deletes every key left of the topic (all start
// with its name), as a raw client sees them; removing them again is no
// error.
func TestDeleteTopicAndGroup(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": partitionedParams} {
		t.Run(name, func(t *testing.T) {
			u := serverURL(t)
			c := transporttest.Open(t, with(u, params))
			rdb := raw(t, u)
			topic, group := topicName(t, u), "g"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := c.CreateTopic(ctx, topic, 3); err != nil {
				t.Fatal(err)
			}
			transporttest.ConsumeSome(t, c, topic, group, 30)

			streams := []string{topic}
			if params != "" {
				streams = []string{topic + ":0", topic + ":1", topic + ":2"}
			}
			// keys lists the topic's keys; groups, the groups on its
			// streams; entries, the entries of its streams.
			keys := func() []string {
				t.Helper()
				var ks []string
				it := rdb.Scan(ctx, 0, topic+"*", 1000).Iterator()
				for it.Next(ctx) {
					ks = append(ks, it.Val())
				}
				if err := it.Err(); err != nil {
					t.Fatal(err)
				}
				slices.Sort(ks)
				return ks
			}
			groups := func() []string {
				t.Helper()
				var gs []string
				for _, s := range streams {
					info, err := rdb.XInfoGroups(ctx, s).Result()
					if err != nil && !strings.Contains(err.Error(), "no such key") {
						t.Fatal(err)
					}
					for _, g := range info {
						gs = append(gs, s+" "+g.Name)
					}
				}
				return gs
			}
			entries := func() int64 {
				t.Helper()
				var n int64
				for _, s := range streams {
					l, err := rdb.XLen(ctx, s).Result()
					if err != nil && err != redis.Nil {
						t.Fatal(err)
					}
					n += l
				}
				return n
			}
			// What a member that crashed leaves of the group beside what
			// a clean stop does: its heartbeat, run counts and leases.
			crashed := []string{topic + ":members:" + group}
			pipe := rdb.Pipeline()
			pipe.ZAdd(ctx, crashed[0], redis.Z{Score: 1, Member: "m"})
			for _, s := range streams {
				crashed = append(crashed, s+":runs:"+group)
				pipe.HSet(ctx, s+":runs:"+group, "1-0", "1:2")
				if params != "" {
					crashed = append(crashed, s+":lease:"+group)
					pipe.Set(ctx, s+":lease:"+group, "m:1", time.Minute)
				}
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			if g, k := groups(), keys(); len(g) != len(streams) || entries() != 30 || !slices.Contains(k, topic+":positions") || !slices.Contains(k, crashed[0]) {
				t.Fatalf("before removal: groups %v, %d entries, keys %v; want one group per stream, 30 entries, the group's positions and %v", g, entries(), k, crashed)
			}
			transporttest.Remove(t, c, topic, group, func() {
				want := append([]string{}, streams...)
				if params != "" {
					want = append(want, topic+":partitions")
				}
				slices.Sort(want)
				if g, k := groups(), keys(); len(g) > 0 || !slices.Equal(k, want) || entries() != 30 {
					t.Errorf("after DeleteGroup: groups %v, keys %v, %d entries; want no group, keys %v and 30 entries", g, k, entries(), want)
				}
			})
			if k := keys(); len(k) > 0 {
				t.Errorf("after DeleteTopic: keys %v left", k)
			}
		})
	}
}

// TestDeleteGroupWithMember: DeleteGroup under a running member,
// unpartitioned and partitioned, destroys the group on the topic's
// streams and deletes its keys; the member creates the group again and
// loses nothing published after (the streams keep it). Once the member
// stopped, DeleteGroup leaves no group on the streams and no key of the
// group, as a raw client sees them.
func TestDeleteGroupWithMember(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": partitionedParams} {
		t.Run(name, func(t *testing.T) {
			u := serverURL(t)
			c := transporttest.Open(t, with(u, params))
			rdb := raw(t, u)
			topic, group := topicName(t, u), "busy"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			t.Cleanup(cancel)
			if err := c.CreateTopic(ctx, topic, 3); err != nil {
				t.Fatal(err)
			}
			streams := []string{topic}
			if params != "" {
				streams = []string{topic + ":0", topic + ":1", topic + ":2"}
			}
			transporttest.DeleteUnderMember(t, c, topic, group, 30, transporttest.Busy{
				Gone: func() {
					var left []string
					for _, s := range streams {
						info, err := rdb.XInfoGroups(ctx, s).Result()
						if err != nil && !strings.Contains(err.Error(), "no such key") {
							t.Fatal(err)
						}
						for _, g := range info {
							left = append(left, s+" group "+g.Name)
						}
					}
					// The group's keys all hold its name; the topic's own
					// keys (streams, layout) do not.
					it := rdb.Scan(ctx, 0, topic+"*"+group+"*", 1000).Iterator()
					for it.Next(ctx) {
						left = append(left, it.Val())
					}
					if err := it.Err(); err != nil {
						t.Fatal(err)
					}
					if h, err := rdb.HKeys(ctx, topic+":positions").Result(); err != nil || len(h) > 0 {
						left = append(left, fmt.Sprintf("positions %v (%v)", h, err))
					}
					if len(left) > 0 {
						t.Errorf("after DeleteGroup of the stopped member: %v left; want nothing of the group", left)
					}
				},
			})
		})
	}
}
