package transporttest

// Attempts survive hand-overs: a message whose handler crashes its
// process (exit status 3, as a segfault in a cgo library or an
// out-of-memory kill would end it) is dead-lettered after MaxAttempts
// processes, not never. Runs on the test's goroutine; children's output
// and the dead-letter reader's handler record into ledgers.

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// testPoisonCrashes publishes 40 messages over 4 keys, one of them
// poisoned, to a group whose consumer processes (MaxAttempts 3) crash on
// the poisoned one: each crash starts another process, until the
// poisoned message is dead-lettered without running again. It must take
// at most MaxAttempts+2 processes (the transport's count, or the
// driver's record, may miss the first crash and the one it lands on);
// the other 39 messages are all handled, none dead-lettered with it.
func (s *faultSuite) testPoisonCrashes(t *testing.T) {
	s.needURL(t)
	const maxAttempts = 3
	pub, _ := s.publisher(t)
	topic := s.topic(t, pub)
	dlq := topic + ".dlq"
	if err := pub.CreateTopic(ctxT(t), dlq, 1); err != nil {
		t.Fatalf("CreateTopic(%q): %v", dlq, err)
	}
	dead := newLedger()
	var opts []omnibus.SubscribeOption
	if s.caps.Replay {
		opts = append(opts, omnibus.StartFrom(omnibus.StartEarliest))
	}
	RunConsumer(t, s.subscribe(t, s.open(t), dlq, dead.handler("dlq"), append(opts, omnibus.Group("dlq-reader"))...))

	l := newLedger()
	const group = "poisoned"
	procs := 1
	c := s.child(t, "p1", topic, group, maxAttempts, l)
	var ms []*omnibus.Message
	var innocent []string
	for i := range 40 {
		m := &omnibus.Message{
			ID:      fmt.Sprintf("%s-%02d", topic, i),
			Key:     "key" + strconv.Itoa(i%4),
			Headers: map[string]string{headerSeq: strconv.FormatInt(seqs.Add(1), 10)},
			Body:    []byte("poison test"),
		}
		if i == 10 {
			m.Headers[headerPoison] = "1"
		} else {
			innocent = append(innocent, m.ID)
		}
		ms = append(ms, m)
	}
	poisoned := ms[10].ID
	if err := pub.Publish(ctxT(t), topic, ms...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	crashes := 0
	deadline := time.Now().Add(3 * time.Minute)
	for len(dead.missing([]string{poisoned})) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 3 minutes and %d crashed processes the poisoned message is not dead-lettered", crashes)
		}
		select {
		case <-c.done:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		if code := c.exitCode(); code != 3 {
			t.Fatalf("consumer process %s ended with status %d, not by the poisoned handler:\n%s", c.name, code, c.stderr.String())
		}
		crashes++
		if crashes > maxAttempts+2 {
			t.Fatalf("the poisoned message crashed %d processes (MaxAttempts %d) and was not dead-lettered; attempts seen by its handler: %v", crashes, maxAttempts, l.poisonAttempts())
		}
		procs++
		c = s.child(t, fmt.Sprint("p", procs), topic, group, maxAttempts, l)
	}
	// The innocent: handled, or dead-lettered with it where the
	// transport's count allows; never lost.
	Eventually(t, 2*time.Minute, func() bool {
		for _, id := range innocent {
			if len(l.missing([]string{id})) > 0 && len(dead.missing([]string{id})) > 0 {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("%d of %d other messages neither handled nor dead-lettered", len(l.missing(innocent)), len(innocent))
	})
	c.stop(timeout)
	collateral := len(innocent) - len(dead.missing(innocent))
	if collateral > 0 {
		t.Errorf("%d messages that never crashed anything were dead-lettered with the poisoned one", collateral)
	}
	t.Logf("FAULT poison: dead-lettered after %d crashed processes (MaxAttempts %d; attempts its handler saw: %v); %d other messages dead-lettered with it, %d handled",
		crashes, maxAttempts, l.poisonAttempts(), collateral, len(innocent)-len(l.missing(innocent)))
}
