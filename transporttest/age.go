package transporttest

// Lag in time: the age of a lane's oldest unsettled message, on
// transports that declare Capabilities.Age. The test runs on the test's
// goroutine; the handler holds the first message on a worker until the
// test releases it.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// ageSlack is what an age may differ from the time measured around it:
// the precision of the transport's timestamps (milliseconds on Kafka) and
// the time between the transport's clock reading and the test's.
const ageSlack = 250 * time.Millisecond

// ageWait is how old the test lets its backlog grow before reading it.
const ageWait = 1500 * time.Millisecond

// testAge holds the first of three messages of one key in its handler,
// lets the backlog age for a measured time, and checks that the lane's
// age is that time; once everything is handled every lane's age is a
// known zero.
func (s *suite) testAge(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().Age, "Age")
	topic := s.topic(t, pub)
	hold, release := released()
	held := make(chan struct{}, 1)
	h := func(ctx context.Context, m *omnibus.Message) error {
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("age"), omnibus.MaxInFlight(1))...)
	runStuck(t, k)
	t.Cleanup(release)

	before := time.Now()
	publishKeys(t, pub, topic, 3, 16, func(int) string { return "aged" })
	after := time.Now()
	select {
	case <-held:
	case <-time.After(timeout):
		t.Fatalf("the handler got no message within %v", timeout)
	}
	time.Sleep(ageWait) // the backlog ages: that is what is measured

	var lags []omnibus.LaneLag
	var read0, read1 time.Time
	Eventually(t, timeout, func() bool {
		read0 = time.Now()
		var err error
		lags, err = k.Lag(ctxT(t))
		read1 = time.Now()
		if err != nil {
			return false
		}
		for _, l := range lags {
			if l.Known && l.Lag > 0 {
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("no lane with lag while a message is held: %+v", lags) })
	lo, hi := read0.Sub(after)-ageSlack, read1.Sub(before)+ageSlack
	aged := 0
	for _, l := range lags {
		switch {
		case l.Known && l.Lag > 0:
			aged++
			if !l.AgeKnown || l.Age < lo || l.Age > hi {
				t.Errorf("lane %s with lag %d: age %v (known %v), want %v..%v: the oldest message was published %v..%v before the read",
					l.Lane, l.Lag, l.Age, l.AgeKnown, lo, hi, read0.Sub(after), read1.Sub(before))
			}
		case l.Known && l.AgeKnown && l.Age != 0:
			t.Errorf("lane %s without lag: age %v, want 0", l.Lane, l.Age)
		}
	}
	if aged != 1 {
		t.Errorf("%d lanes with lag, want the one lane of the key: %+v", aged, lags)
	}

	release()
	awaitNoLag(t, k)
	Eventually(t, timeout, func() bool {
		var err error
		if lags, err = k.Lag(ctxT(t)); err != nil {
			return false
		}
		for _, l := range lags {
			if !l.AgeKnown || l.Age != 0 {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("every message handled, yet not every lane's age is a known 0: %+v", lags)
	})
}
