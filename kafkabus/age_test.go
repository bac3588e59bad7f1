package kafkabus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestAgeFromRecordTimestamps: a lane's age is the timestamp of the
// record at the committed offset. Kafka keeps the producer's timestamp,
// so the backlog's age is set when producing (no waiting): records one
// hour, 30 minutes and 1 minute old. As the group commits, the age moves
// to the next record; with everything committed it is a known 0; from
// outside the group it is the same. The group's member count is the
// coordinator's.
func TestAgeFromRecordTimestamps(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(2, "aged"))
	c := transporttest.Open(t, clusterURL(cluster, ""))
	now := time.Now()
	olds := []time.Duration{time.Hour, 30 * time.Minute, time.Minute}
	// kafkabus stamps records with the time it produces them (a
	// message's own Time travels in ce_time): produce with franz-go.
	raw, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, old := range olds {
		r := &kgo.Record{Topic: "aged", Partition: 1, Timestamp: now.Add(-old), Value: []byte("x")}
		if err := raw.ProduceSync(ctxT(t), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{}, len(olds))
	k, err := c.Subscribe(ctxT(t), "aged", func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, omnibus.Group("aged"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderLane), omnibus.CommitInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(gate) }()
	transporttest.RunConsumer(t, k)

	// aged returns the one lane with lag (the key's), and checks that
	// the other is a known 0.
	aged := func(lags []omnibus.LaneLag) omnibus.LaneLag {
		t.Helper()
		var with []omnibus.LaneLag
		for _, l := range lags {
			if !l.Known {
				t.Fatalf("lane %s unknown with the cluster up", l.Lane)
			}
			if l.Lag > 0 {
				with = append(with, l)
			} else if !l.AgeKnown || l.Age != 0 {
				t.Errorf("lane %s without lag: age %v (known %v), want a known 0", l.Lane, l.Age, l.AgeKnown)
			}
		}
		if len(with) != 1 {
			t.Fatalf("lanes with lag: %+v, want the key's alone", lags)
		}
		return with[0]
	}
	check := func(lag int64, old time.Duration) {
		t.Helper()
		var l omnibus.LaneLag
		transporttest.Eventually(t, 30*time.Second, func() bool {
			lags, err := k.Lag(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			l = aged(lags)
			return l.Lag == lag
		}, func() string { return "lag never reached " + time.Duration(lag).String() })
		// Timestamps are in milliseconds; the read takes a moment.
		since := time.Since(now)
		if !l.AgeKnown || l.Age < old-time.Millisecond || l.Age > old+since+time.Millisecond {
			t.Errorf("lag %d: age %v (known %v), want %v..%v", lag, l.Age, l.AgeKnown, old, old+since)
		}
	}
	check(3, olds[0])
	gate <- struct{}{}
	check(2, olds[1])
	gate <- struct{}{}
	check(1, olds[2])

	outside, err := c.Lag(ctxT(t), "aged", "aged")
	if err != nil {
		t.Fatal(err)
	}
	if l := aged(outside); !l.AgeKnown || l.Age < olds[2]-time.Millisecond || l.Age > olds[2]+time.Since(now)+time.Millisecond || l.Committed != 2 {
		t.Errorf("from outside the group: age %v (known %v) at offset %d, want %v at offset 2", l.Age, l.AgeKnown, l.Committed, olds[2])
	}
	gate <- struct{}{}
	transporttest.Eventually(t, 30*time.Second, func() bool {
		lags, err := k.Lag(ctxT(t))
		if err != nil {
			return false
		}
		for _, l := range lags {
			if !l.Known || l.Lag != 0 || !l.AgeKnown || l.Age != 0 {
				return false
			}
		}
		return true
	}, func() string { return "every record committed, yet not every lane a known age 0" })

	if n, err := c.Members(ctxT(t), "aged", "aged"); n != 1 || err != nil {
		t.Errorf("Members: %d, %v; want 1", n, err)
	}
	if err := k.Scale(ctxT(t), 2); err != nil {
		t.Fatal(err)
	}
	if n, err := k.GroupMembers(ctxT(t)); n != 2 || err != nil {
		t.Errorf("GroupMembers after Scale(2): %d, %v; want 2", n, err)
	}
	if _, err := c.Members(ctxT(t), "aged", "no-such-group"); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Members of a missing group: %v, want ErrNotFound", err)
	}
}
