package nsqbus_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestChannelDeleted deletes a running group's channel behind its back,
// as an operator with nsqadmin would: nsqd drops the channel's messages
// and disconnects its consumers. The members connect again (re-creating
// the channel) and get what is published after; Run goes on.
func TestChannelDeleted(t *testing.T) {
	n, _ := cluster(t)
	c := transporttest.Open(t, directURL(t))
	topic := fmt.Sprintf("deleted-%x", rand.Uint32())
	t.Cleanup(func() { deleteTopic(t, topic) })
	ctx := context.Background()
	before, after := newCollector(), newCollector()
	var cur atomic.Pointer[collector]
	cur.Store(before)
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		return cur.Load().handle(ctx, m)
	}, omnibus.Group("g"), omnibus.Members(2))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	publish := func(from int) []string {
		ms := numbered("deleted", from, 50, 10)
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(ms))
		for i, m := range ms {
			ids[i] = m.ID
		}
		return ids
	}
	awaitAll(t, 30*time.Second, publish(0), before)
	cur.Store(after)
	if err := nsqtest.Post(n.HTTPAddr(), "/channel/delete", url.Values{"topic": {topic}, "channel": {"g"}}); err != nil {
		t.Fatal(err)
	}
	// Whether the members are back or not: a topic without a channel
	// keeps its messages for the first channel it gets.
	ids := publish(50)
	awaitAll(t, 30*time.Second, ids, after)
	t.Logf("after the delete: %d messages, %d duplicates", after.unique(), after.dups())
}
