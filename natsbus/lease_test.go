package natsbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestLeasesOutliveSlowWrites: a member holds the four partitions of a
// topic; then the server denies its writes of its heartbeat and of two
// of its leases (a publish the server drops unanswered: each such write
// waits out its timeout, a quarter of lease_ttl, every round). For two
// lease_ttl the member must go on writing the two leases it can still
// write, each well within the three quarters of lease_ttl after which it
// gives a lease up (written one after the other, the denied writes'
// timeouts pushed the others past that), never delete them, and handle
// what is published on their partitions. The failing heartbeat has the
// member look its bucket up, which is there: it restores nothing.
func TestLeasesOutliveSlowWrites(t *testing.T) {
	addr, deny := permServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const ttl = 2 * time.Second // partitionedParams' lease_ttl
	base := "nats://member:pw@" + addr
	c := transporttest.Open(t, base+"?"+partitionedParams)
	topic := newTopic(ctx, t, c, base, 4)
	group := "slow"
	col := newCollector()
	k, err := c.Subscribe(ctx, topic, col.handle, omnibus.Group(group))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	holdsLanes(t, k, 4)

	bucket := natsbus.LeaseBucket(topic, group)
	kv, err := rawJetStream(t, "nats://admin:pw@"+addr).KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "p.>", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()

	deny("$KV."+bucket+".m.>", "$KV."+bucket+".p.0", "$KV."+bucket+".p.1")

	kept := map[string]time.Time{"p.2": time.Now(), "p.3": time.Now()}
	writes := map[string]int{}
	end := time.After(2 * ttl)
watch:
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				t.Fatal("the test's watcher of the lease bucket stopped")
			}
			if e == nil {
				continue
			}
			last, mine := kept[e.Key()]
			if !mine {
				continue
			}
			now := time.Now()
			switch {
			case e.Operation() != jetstream.KeyValuePut:
				t.Errorf("lease %s: %v after %d writes; want it kept", e.Key(), e.Operation(), writes[e.Key()])
			case now.Sub(last) > ttl*3/4:
				t.Errorf("lease %s written again %v after the last write; want within %v", e.Key(), now.Sub(last).Round(time.Millisecond), ttl*3/4)
			}
			kept[e.Key()] = now
			writes[e.Key()]++
		case <-end:
			break watch
		}
	}
	for key, last := range kept {
		if since := time.Since(last); since > ttl*3/4 {
			t.Errorf("lease %s not written for %v at the end; want within %v", key, since.Round(time.Millisecond), ttl*3/4)
		}
	}
	t.Logf("writes in %v with the heartbeat and leases p.0, p.1 denied: %v", 2*ttl, writes)

	var keys []string
	for _, p := range []int{2, 3} {
		keys = append(keys, keysOn(p, 4, 5)...)
	}
	col.waitAll(t, publishTo(t, c, topic, keys), 15*time.Second)
}
