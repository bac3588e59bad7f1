package nsqbus_test

import (
	"slices"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a topic, by an
// nsqd's URL and by nsqlookupd's, DeleteGroup deletes the group's channel
// and leaves the topic; DeleteTopic deletes the topic, as nsqd's /stats
// shows them; removing them again is no error.
func TestDeleteTopicAndGroup(t *testing.T) {
	for name, u := range map[string]string{"direct": directURL(t), "lookup": lookupURL(t)} {
		t.Run(name, func(t *testing.T) {
			n, _ := cluster(t)
			c := transporttest.Open(t, u)
			topic, group := "remove-"+omnibus.NewID()[12:], "g"
			t.Cleanup(func() { deleteTopic(t, topic) })
			transporttest.ConsumeSome(t, c, topic, group, 30)
			has := func() (topicThere bool, channels []string) {
				t.Helper()
				topics, err := nsqtest.Topics(n.HTTPAddr())
				if err == nil {
					channels, err = nsqtest.Channels(n.HTTPAddr(), topic)
				}
				if err != nil {
					t.Fatal(err)
				}
				return slices.Contains(topics, topic), channels
			}
			if there, channels := has(); !there || !slices.Equal(channels, []string{group}) {
				t.Fatalf("before removal: topic there %v, channels %v; want true, [%s]", there, channels, group)
			}
			transporttest.Remove(t, c, topic, group, func() {
				if there, channels := has(); !there || len(channels) > 0 {
					t.Errorf("after DeleteGroup: topic there %v, channels %v; want true, none", there, channels)
				}
			})
			if there, _ := has(); there {
				t.Error("the topic is on nsqd after DeleteTopic")
			}
		})
	}
}

// TestDeleteGroupWithMember: DeleteGroup under a running member deletes
// the group's channel (nsqd closes the member's connections on it); the
// member subscribes again, which creates the channel again, and loses
// nothing published after: a topic without a channel keeps its messages
// for the first channel to come. Once the member stopped, DeleteGroup
// leaves the topic without the channel, as nsqd's /stats shows.
func TestDeleteGroupWithMember(t *testing.T) {
	n, _ := cluster(t)
	c := transporttest.Open(t, directURL(t))
	topic, group := "busy-"+omnibus.NewID()[12:], "g"
	t.Cleanup(func() { deleteTopic(t, topic) })
	transporttest.DeleteUnderMember(t, c, topic, group, 30, transporttest.Busy{
		Gone: func() {
			channels, err := nsqtest.Channels(n.HTTPAddr(), topic)
			if err != nil {
				t.Fatal(err)
			}
			if len(channels) > 0 {
				t.Errorf("after DeleteGroup of the stopped member: channels %v; want none", channels)
			}
		},
	})
}
