package transporttest

// The server restarted mid-stream: while 20,000 messages are published
// and consumed, the harness restarts the server. Publish must ride
// through it (no call fails), and nothing may be lost. Runs on the test's
// goroutine; the consumer's handlers record into the ledger.

import (
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// testServerRestart restarts the server a third of the way through the
// publishing of 20,000 messages, with a consumer group reading them.
func (s *faultSuite) testServerRestart(t *testing.T) {
	if s.h.Restart == nil {
		t.Skip("SKIP (harness Restart): this harness cannot restart its server")
	}
	pub, retried := s.publisher(t)
	topic := s.topic(t, pub)
	l := newLedger()
	var opts []omnibus.SubscribeOption
	if s.caps.Replay {
		opts = append(opts, omnibus.StartFrom(omnibus.StartEarliest))
	}
	k := s.subscribe(t, s.open(t), topic, l.handler("consumer"), append(opts, omnibus.Group("restart"), omnibus.MaxInFlight(64))...)
	RunConsumer(t, k)
	st := startStream(t, pub, topic, faultMessages, 20*time.Millisecond)
	Eventually(t, 2*time.Minute, func() bool { return st.published.Load() >= faultMessages/3 && l.unique() > 0 }, func() string {
		return fmt.Sprintf("%d published, %d handled before the restart", st.published.Load(), l.unique())
	})
	began := time.Now()
	at := st.published.Load()
	s.h.Restart(ctxT(t), t)
	t.Logf("server restarted in %v after %d published, %d handled", time.Since(began).Round(time.Millisecond), at, l.unique())
	ids := st.wait(t)
	l.await(t, 3*time.Minute, ids)
	l.check(t, "server restart", s.caps.Ordered, len(ids),
		fmt.Sprintf("; every Publish rode through; %d messages published again", retried.Load()))
}
