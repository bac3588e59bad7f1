package transporttest

// A consumer killed mid-stream: consumer processes of one group are
// killed with SIGKILL while messages flow, and others start in their
// place. Runs on the test's goroutine; the children's output is read on
// their own goroutines into the ledger.

import (
	"fmt"
	"testing"
	"time"
)

// testConsumerKilled kills a consumer process (SIGKILL) a third of the
// way through 20,000 messages and another two thirds of the way, each
// replaced by a new one: every message published is handled, none for
// the first time after a newer one of its key (where lanes are ordered);
// what a killed process had not settled comes again, counted as
// duplicates.
func (s *faultSuite) testConsumerKilled(t *testing.T) {
	s.needURL(t)
	pub, retried := s.publisher(t)
	topic := s.topic(t, pub)
	l := newLedger()
	const group = "killed"
	alive := []*child{s.child(t, "a", topic, group, 5, l), s.child(t, "b", topic, group, 5, l)}
	st := startStream(t, pub, topic, faultMessages, 0)
	began := time.Now()
	for i := range 2 {
		at := faultMessages * (i + 1) / 3
		Eventually(t, 3*time.Minute, func() bool { return l.unique() >= at }, func() string {
			return fmt.Sprintf("%d handled, waiting for %d before a kill", l.unique(), at)
		})
		alive[0].kill()
		t.Logf("killed consumer %s after %d handled (%v)", alive[0].name, l.unique(), time.Since(began).Round(time.Millisecond))
		alive = append(alive[1:], s.child(t, fmt.Sprint("c", i), topic, group, 5, l))
	}
	ids := st.wait(t)
	l.await(t, 3*time.Minute, ids)
	took := time.Since(began)
	for _, c := range alive {
		c.stop(timeout)
	}
	l.check(t, "consumer killed", s.caps.Ordered, len(ids),
		fmt.Sprintf("; 2 of 4 consumer processes killed with SIGKILL; %d messages published again; %v", retried.Load(), took.Round(time.Millisecond)))
}
