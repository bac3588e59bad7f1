package transporttest

// The server behind the consumer's back (hostile): a group's state
// deleted while it runs or is stopped, a server restart, and commits the
// server refuses at Shutdown. Nothing may be lost; duplicates are
// allowed where the fault can cause them. The tests run on the test's
// goroutine and drive the server through the harness's hooks; handlers
// record into collectors (guarded by their mutex).

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// --- a group's state deleted behind its back ---

// testGroupDeleted deletes what the server keeps of a group: the group
// must still get every message published while it was stopped, and
// everything published after the deletion while it runs. A group whose
// position is gone may read again what it had settled (duplicates), but
// never skips.
func (s *suite) testGroupDeleted(t *testing.T) {
	if s.h.DeleteGroup == nil {
		t.Skip("SKIP (harness DeleteGroup): the harness cannot delete a group's state apart from its messages")
	}
	const group = "deleted"
	t.Run("WhileStopped", func(t *testing.T) {
		pub := s.open(t)
		topic := s.topic(t, pub)
		first := newCollector()
		k := s.subscribe(t, s.open(t), topic, first.handler, append(earliest(pub), omnibus.Group(group))...)
		stop := RunConsumer(t, k)
		first.await(t, publishN(t, pub, topic, 10, 4, 8))
		awaitNoLag(t, k)
		stop()
		ids := publishN(t, pub, topic, 20, 4, 8)
		s.h.DeleteGroup(ctxT(t), t, topic, group)
		// The group comes back without asking for the earliest: it
		// exists, so it must not start at the end.
		again := newCollector()
		RunConsumer(t, s.subscribe(t, s.open(t), topic, again.handler, omnibus.Group(group)))
		again.awaitWithin(t, 30*time.Second, ids)
		first.check(t, orderOf(pub), false)
		again.check(t, orderOf(pub), true)
	})
	t.Run("WhileRunning", func(t *testing.T) {
		pub := s.open(t)
		topic := s.topic(t, pub)
		before, after := newCollector(), newCollector()
		var cur atomic.Pointer[collector]
		cur.Store(before)
		h := func(ctx context.Context, m *omnibus.Message) error {
			cur.Load().add(m)
			return nil
		}
		k := s.subscribe(t, s.open(t), topic, h, append(earliest(pub), omnibus.Group(group))...)
		stop := RunConsumer(t, k)
		before.await(t, publishN(t, pub, topic, 20, 4, 8))
		awaitNoLag(t, k) // nothing in flight: whatever comes after is in order
		cur.Store(after)
		s.h.DeleteGroup(ctxT(t), t, topic, group)
		ids := publishN(t, pub, topic, 20, 4, 8)
		after.awaitWithin(t, 30*time.Second, ids)
		stop()
		before.check(t, orderOf(pub), false)
		after.check(t, orderOf(pub), true)
	})
}

// --- a server restart ---

func (s *suite) testReconnect(t *testing.T) {
	if s.h.Restart == nil {
		t.Skip("SKIP (harness Restart): this harness cannot restart its server; the transport's own restart test covers it")
	}
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("reconnect"))...)
	RunConsumer(t, k)
	ids := publishN(t, pub, topic, 200, 4, 8)
	Eventually(t, timeout, func() bool { return col.unique() == 200 }, func() string { return "no delivery before restart" })
	// Once everything handled is committed, a restart has nothing to
	// deliver again: whatever comes back after it must still keep order.
	awaitNoLag(t, k)
	s.h.Restart(ctxT(t), t)
	ids = append(ids, publishN(t, pub, topic, 200, 4, 8)...)
	col.await(t, ids)
	col.check(t, orderOf(pub), true)
}

// --- failures reported ---

// testShutdownReportsFailedCommit makes the server refuse commits before
// Shutdown: Shutdown says so, and the group gets the messages again.
func (s *suite) testShutdownReportsFailedCommit(t *testing.T) {
	if s.h.FailCommits == nil {
		t.Skip("SKIP (harness FailCommits): the harness cannot make commits fail; the engine's own tests cover the report")
	}
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("commit"))...)
	done := start(context.Background(), k)
	col.await(t, publishN(t, pub, topic, 10, 4, 8))
	awaitNoLag(t, k)
	restore := s.h.FailCommits(t)
	t.Cleanup(restore)
	ids := publishN(t, pub, topic, 20, 4, 8)
	col.await(t, ids)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if !within(t, 15*time.Second, "Shutdown", func() { err = k.Shutdown(ctx) }) {
		return
	}
	if err == nil {
		t.Errorf("Shutdown returned nil though the server refused its commits")
	} else {
		t.Logf("Shutdown: %v", err)
	}
	awaitRun(t, done, hang)
	restore()
	// Not committed, so not lost: the group reads them again.
	again := newCollector()
	RunConsumer(t, s.subscribe(t, s.open(t), topic, again.handler, append(earliest(sub), omnibus.Group("commit"))...))
	again.awaitWithin(t, 30*time.Second, ids)
}
