package natsbus

// Subscribing: a group member (sub), joining an unpartitioned group (a
// partitioned one is in partition.go) and leaving it: Close hands back
// what the member did not settle, or releases its leases. Subscribe and
// Close run on the caller's goroutine; sub.mu guards the readers and the
// held set.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// unorderedLane is the lane of an unpartitioned topic.
const unorderedLane = "0"

// Subscribe implements driver.Conn. On an unpartitioned topic the group
// is one durable pull consumer whose members compete for messages on a
// single unordered lane; on a partitioned topic see subscribePartitioned.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if err := checkTopic("subscribe", topic); err != nil {
		return nil, err
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	ref, err := c.stream(ctx, topic, 0)
	if err != nil {
		return nil, err
	}
	if ref.parts > 0 {
		return c.subscribePartitioned(ctx, topic, ref, opts)
	}
	fail := func(err error) (driver.Subscriber, error) {
		return nil, fmt.Errorf("natsbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	s := newSub(c, topic, ref, opts)
	if !opts.Ephemeral {
		// Nobody resumes a throwaway group: it keeps no positions, and
		// its consumer deleted behind its back is an error.
		if s.pos, err = c.positions(ctx, ref, opts.Group); err != nil {
			return fail(err)
		}
	}
	if err := s.join(ctx); err != nil {
		return fail(err)
	}
	cons, err := s.consumer(ctx, unorderedLane)
	if err != nil {
		return fail(err)
	}
	r := s.newReader(unorderedLane, cons, false)
	if err := c.addSub(s); err != nil {
		r.halt(false)
		return nil, fmt.Errorf("natsbus: subscribe %q: %w", topic, err)
	}
	if opts.Ephemeral {
		c.joinEphemeral(ref.name, opts.Group)
		s.cleanup = func(ctx context.Context) {
			if c.leaveEphemeral(ref.name, opts.Group) {
				_ = c.js.DeleteConsumer(ctx, ref.name, s.consumerName(unorderedLane))
			}
		}
	}
	opts.Lanes.Claimed([]string{unorderedLane})
	s.mu.Lock()
	s.readers[unorderedLane] = r
	s.mu.Unlock()
	s.startPump(r)
	s.startKeeper()
	return s, nil
}

// sub is one group member.
//
// Goroutines: one pump per reader (a claimed lane's consumer), feeding
// the inbox; the keeper, sending in-progress signals for what the member
// holds and recording the group's positions; in partitioned mode the
// lease goroutines (see partitioned). All end in Close.
type sub struct {
	c      *conn
	topic  string
	ref    *streamRef
	opts   driver.SubscribeOptions
	pos    *positions // nil for a throwaway unpartitioned group
	inbox  *inbox
	closed chan struct{}
	wg     sync.WaitGroup

	wake chan struct{} // makes a Receive in progress return: a lane is going
	part *partitioned  // nil on an unpartitioned topic

	// Receive's own: calls never overlap.
	batch  []item
	carry  []*driver.Delivery // received, did not fit in the last Receive
	failed error              // a read error to return from the next Receive

	// cleanup runs in Close after the readers stopped (ephemeral groups
	// delete their consumer there); nil when there is nothing to do.
	cleanup func(ctx context.Context)

	mu      sync.Mutex
	readers map[string]*reader // by lane
	held    heldList           // pulled and not yet settled: in-progress signals, hand-back on Close
	settled settledLanes       // partitioned: acknowledged above the lanes' ack floors (settled.go)

	closeOnce sync.Once
}

func newSub(c *conn, topic string, ref *streamRef, opts driver.SubscribeOptions) *sub {
	return &sub{
		c: c, topic: topic, ref: ref, opts: opts,
		inbox:   newInbox(),
		closed:  make(chan struct{}),
		wake:    make(chan struct{}, 1),
		readers: map[string]*reader{},
		settled: settledLanes{},
	}
}

// lanes are the group's lanes: "0" on an unpartitioned topic, "0" ...
// "N-1" on a partitioned one.
func (s *sub) lanes() []string {
	if s.ref.parts == 0 {
		return []string{unorderedLane}
	}
	ls := make([]string, s.ref.parts)
	for p := range ls {
		ls[p] = strconv.Itoa(p)
	}
	return ls
}

// Wake implements driver.Waker: the Receive in progress returns empty.
func (s *sub) Wake() { driver.Notify(s.wake) }

// Close implements driver.Subscriber: it stops reading and leaves the
// group. A member of an unpartitioned group hands back at once (Nak)
// everything it pulled and the engine did not settle: what the engine
// abandoned, what waits in the inbox, and what its pulls still buffer,
// so the group's other members get it now rather than after ack_wait.
// A partitioned member releases its leases instead (see the
// package documentation). The durable consumer (the group's position)
// stays, except for a throwaway group's last member, which deletes it.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		if s.part != nil {
			s.part.stop()
		}
		s.mu.Lock()
		readers := s.readers
		s.readers = map[string]*reader{}
		s.mu.Unlock()
		for _, r := range readers {
			r.halt(s.part == nil)
		}
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s.part != nil {
			s.part.leave(ctx)
		} else {
			s.handBack()
			for _, r := range readers {
				s.recordLane(ctx, r)
			}
		}
		s.mu.Lock()
		s.held.clear()
		s.mu.Unlock()
		if s.cleanup != nil {
			s.cleanup(ctx)
		}
		s.c.removeSub(s)
	})
	return nil
}

// handBack naks every delivery the member holds.
func (s *sub) handBack() {
	var msgs []jetstream.Msg
	s.mu.Lock()
	for h := range s.held.all() {
		s.held.remove(h)
		msgs = append(msgs, h.msg)
	}
	s.mu.Unlock()
	for _, m := range msgs {
		_ = m.Nak()
	}
}
