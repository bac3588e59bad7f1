package kafkabus_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a topic, DeleteGroup
// and DeleteTopic leave the cluster without the topic and the group, as a
// raw admin client lists them; removing them again is no error. A group
// with offsets on another topic keeps those, and the group.
func TestDeleteTopicAndGroup(t *testing.T) {
	kc := newCluster(t)
	c := transporttest.Open(t, clusterURL(kc, ""))
	ctx := ctxT(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	groups := func() string {
		t.Helper()
		ls, err := adm.ListGroups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gs := ls.Groups()
		slices.Sort(gs)
		return strings.Join(gs, ",")
	}
	offsetTopics := func(group string) []string {
		t.Helper()
		os, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		return os.Partitions().Topics() // sorted
	}
	topicExists := func(topic string) bool {
		t.Helper()
		cl.PurgeTopicsFromClient(topic) // kadm's metadata is cached
		tds, err := adm.ListTopics(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		return tds.Has(topic)
	}

	for _, topic := range []string{"removed", "kept"} {
		if err := c.CreateTopic(ctx, topic, 3); err != nil {
			t.Fatal(err)
		}
		transporttest.ConsumeSome(t, c, topic, "g", 30)
	}
	if got := offsetTopics("g"); strings.Join(got, ",") != "kept,removed" || groups() != "g" || !topicExists("removed") {
		t.Fatalf("before removal: group g has offsets on %v, groups %q, topic removed exists %v; want kept and removed, g, true",
			got, groups(), topicExists("removed"))
	}
	transporttest.Remove(t, c, "removed", "g", func() {
		if got := offsetTopics("g"); strings.Join(got, ",") != "kept" || !topicExists("removed") {
			t.Errorf("after DeleteGroup: group g has offsets on %v, topic removed exists %v; want kept alone, true", got, topicExists("removed"))
		}
	})
	if topicExists("removed") || !topicExists("kept") {
		t.Errorf("after DeleteTopic: topic removed exists %v, kept exists %v; want false, true", topicExists("removed"), topicExists("kept"))
	}
	transporttest.Remove(t, c, "kept", "g", func() {
		if g := groups(); g != "" || !topicExists("kept") {
			t.Errorf("after DeleteGroup: groups %q, topic kept exists %v; want none, true", g, topicExists("kept"))
		}
	})
	if topicExists("kept") {
		t.Error("topic kept exists after DeleteTopic")
	}
}

// TestDeleteGroupWithMember: DeleteGroup refuses a group with a member
// running, and leaves its committed offsets; the member goes on
// consuming, and once it stopped DeleteGroup removes the group. kfake
// answers as Kafka does: DeleteGroups with NON_EMPTY_GROUP (Kafka's
// GroupNotEmptyException, kerr.NonEmptyGroup) while the group has a
// member, and OffsetDelete, for a group with offsets on another topic
// too, with GROUP_SUBSCRIBED_TO_TOPIC for the topic a member consumes.
func TestDeleteGroupWithMember(t *testing.T) {
	for name, tc := range map[string]struct {
		other  bool // the group has offsets on another topic too
		refuse *kerr.Error
	}{
		"whole group":    {false, kerr.NonEmptyGroup},
		"offsets on one": {true, kerr.GroupSubscribedToTopic},
	} {
		t.Run(name, func(t *testing.T) {
			kc := newCluster(t)
			c := transporttest.Open(t, clusterURL(kc, ""))
			ctx := ctxT(t)
			cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			adm := kadm.NewClient(cl)
			// offsets lists the group's committed offsets, by topic.
			offsets := func() map[string]int64 {
				t.Helper()
				os, err := adm.FetchOffsets(ctx, "g")
				if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
					t.Fatal(err)
				}
				sum := map[string]int64{}
				os.Each(func(o kadm.OffsetResponse) { sum[o.Topic] += o.At })
				return sum
			}
			for _, topic := range []string{"busy", "other"} {
				if err := c.CreateTopic(ctx, topic, 3); err != nil {
					t.Fatal(err)
				}
			}
			if tc.other {
				transporttest.ConsumeSome(t, c, "other", "g", 30)
			}
			transporttest.DeleteUnderMember(t, c, "busy", "g", 30, transporttest.Busy{
				Refused: func(err error) bool { return errors.Is(err, tc.refuse) },
				Deleted: func() {
					if got := offsets(); got["busy"] != 30 {
						t.Errorf("after the refused DeleteGroup: the group's offsets %v; want the 30 records of busy committed", got)
					}
				},
				Gone: func() {
					want := map[string]int64{}
					if tc.other {
						want["other"] = 30
					}
					if got := offsets(); !maps.Equal(got, want) {
						t.Errorf("after DeleteGroup of the stopped member: the group's offsets %v; want %v", got, want)
					}
					ls, err := adm.ListGroups(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if has := slices.Contains(ls.Groups(), "g"); has != tc.other {
						t.Errorf("after DeleteGroup of the stopped member: group g listed %v; want %v", has, tc.other)
					}
				},
			})
		})
	}
}
