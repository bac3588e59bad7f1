package natsbus

// Readers: one per lane the member reads, a pull iterator on the lane's
// consumer, and the pump goroutine that moves what it pulls into the
// inbox, starts a new iterator after an error and re-creates a consumer
// deleted behind the group's back. reader.itMu guards the iterator and
// the consumer; sub.mu guards what a reader remembers of the sequences it
// pulled and acknowledged.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// reader reads one lane: a durable consumer and its pull iterator.
type reader struct {
	lane    string
	itMu    sync.Mutex // guards cons and it, replaced by the pump after an error
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	stopped atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	// exclusive is set for a partition's reader: the only one meant to
	// read its consumer, so a redelivery it pulls is normally of a
	// message it pulled before (see sub.hold). Guarded by sub.mu: top,
	// the highest stream sequence pulled; pulled, the sequences pulled
	// above floor, ascending (at most maxPulled); floor, the consumer's
	// ack floor when last read; nacked, the sequences handed back with
	// Nack and due to come again.
	exclusive bool
	top       uint64
	pulled    []uint64
	floor     uint64
	nacked    map[uint64]struct{}
	// dseq is the consumer's delivery sequence of the last message r
	// pulled (its Delivered.Consumer when r started). The server numbers
	// every delivery, so a message above dseq+1 tells that a delivery
	// never reached r (dropped by the client as a slow consumer, or taken
	// by a stale pull): it comes back after ack_wait, behind newer
	// messages (see sub.hold). Guarded by sub.mu.
	dseq uint64
	// recent is the last sequences this reader acknowledged (a ring, next
	// write at recentAt), for a plain reader to know a second delivery of
	// one. Guarded by sub.mu.
	recent   [recentAcks]uint64
	recentAt int

	// Partitioned mode: the lane's lease. After deadline (unix
	// nanoseconds; 0 without a lease) or once lost, the lane may belong
	// to another member: nothing more of it is delivered, acknowledged or
	// kept in progress.
	deadline atomic.Int64
	lost     atomic.Bool
	acked    atomic.Uint64 // highest stream sequence acknowledged
	// claimAt is the lane's resume position when the member claimed it,
	// until its first delivery (0 after, or without a claim): see claim.
	claimAt atomic.Uint64
}

// valid reports whether r's deliveries may still be handed out and
// acknowledged. Once the lease's deadline passed, r is lost for good,
// even if a late refresh succeeds: handing out what follows a message
// dropped meanwhile would break the lane's order, so the lane is given
// up (Lanes.Lost) and claimed afresh at its ack floor.
func (r *reader) valid(now time.Time) bool {
	if r.lost.Load() {
		return false
	}
	if dl := r.deadline.Load(); dl != 0 && now.UnixNano() >= dl {
		r.lost.Store(true)
		return false
	}
	return true
}

// maxPulled bounds the sequences a partition's reader remembers between
// two reads of its ack floor (recordEvery): past it, the oldest are
// forgotten, and a copy of one of those is handed on (a duplicate, never
// a loss).
const maxPulled = 1 << 20

// pulledLocked reports whether r pulled seq: at or below the consumer's
// ack floor (settled on the server), or remembered. Called with sub.mu.
func (r *reader) pulledLocked(seq uint64) bool {
	if seq <= r.floor {
		return true
	}
	_, found := slices.BinarySearch(r.pulled, seq)
	return found
}

// recentAcks is how many acknowledged sequences a plain reader remembers.
const recentAcks = 256

// ackedRecentlyLocked reports whether r acknowledged seq lately.
func (r *reader) ackedRecentlyLocked(seq uint64) bool {
	for _, q := range r.recent {
		if q == seq {
			return true
		}
	}
	return false
}

// pullLocked remembers that r pulled seq, above any it pulled before.
// Called with sub.mu.
func (r *reader) pullLocked(seq uint64) {
	r.top = max(r.top, seq)
	if !r.exclusive {
		return
	}
	if len(r.pulled) >= maxPulled {
		r.pulled = slices.Delete(r.pulled, 0, maxPulled/2)
	}
	r.pulled = append(r.pulled, seq)
}

// raiseFloorLocked records the consumer's ack floor: what is at or below
// it need not be remembered. Called with sub.mu.
func (r *reader) raiseFloorLocked(floor uint64) {
	if floor <= r.floor {
		return
	}
	r.floor = floor
	n, _ := slices.BinarySearch(r.pulled, floor+1)
	r.pulled = slices.Delete(r.pulled, 0, n)
}

// consumer returns r's current consumer.
func (r *reader) consumer() jetstream.Consumer {
	r.itMu.Lock()
	defer r.itMu.Unlock()
	return r.cons
}

// failNextRead, set by tests, fails a pump's next read as a missed
// heartbeat would, dropping the message it read.
var failNextRead atomic.Bool

// pullExpiry is how long a pull request waits on the server. The pull
// iterator learns of a request the server dropped without a word (one
// that reached a consumer being deleted: "no responders") only when
// heartbeats stop, after pullExpiry; nats.go's default is 30s.
const pullExpiry = 5 * time.Second

// messages starts a pull on cons, sized to the engine's bounds: at most
// MaxInFlight messages buffered, and requests of at most MaxInFlightBytes
// (never less than the largest message the server accepts, which would
// stall the pull). A pinned partition consumer is pulled in its priority
// group.
func (s *sub) messages(cons jetstream.Consumer) (jetstream.MessagesContext, error) {
	n := max(1, s.opts.MaxInFlight)
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(n), jetstream.PullExpiry(pullExpiry)}
	if b := s.opts.MaxInFlightBytes; b > 0 {
		opts[0] = jetstream.PullMaxMessagesWithBytesLimit(n, max(b, int(s.c.nc.MaxPayload())+4096))
	}
	if pinned(cons.CachedInfo()) {
		opts = append(opts, jetstream.PullPriorityGroup(pinGroup))
	}
	return cons.Messages(opts...)
}

func (s *sub) newReader(lane string, cons jetstream.Consumer, exclusive bool) (*reader, error) {
	it, err := s.messages(cons)
	if err != nil {
		return nil, err
	}
	r := &reader{lane: lane, cons: cons, it: it, stop: make(chan struct{}), done: make(chan struct{}), exclusive: exclusive}
	if exclusive {
		r.nacked = map[uint64]struct{}{}
		r.dseq = cons.CachedInfo().Delivered.Consumer
	}
	return r, nil
}

func (s *sub) startPump(r *reader) {
	s.wg.Add(1)
	go s.pump(r)
}

// pump moves messages from r's iterator to the inbox until r stops,
// holding each from the moment it is pulled. Once r stops, it empties
// what the iterator still buffers (see halt): handed back with Nak when
// the member leaves an unpartitioned group, dropped otherwise (the
// partition's next owner resets its consumer).
func (s *sub) pump(r *reader) {
	defer s.wg.Done()
	defer close(r.done)
	failures := 0
	for {
		r.itMu.Lock()
		it := r.it
		r.itMu.Unlock()
		msg, err := it.Next()
		if err == nil && failNextRead.Load() && failNextRead.CompareAndSwap(true, false) {
			err = jetstream.ErrNoHeartbeat // msg dropped, as the iterator's buffer would be
		}
		if r.stopped.Load() {
			if err != nil {
				return
			}
			if s.part == nil {
				_ = msg.Nak()
			}
			continue
		}
		if err == nil {
			failures = 0
			h, err := s.hold(r, msg)
			if errors.Is(err, errMissed) {
				s.part.abandon(r, err) // see the exclusive reader's failed read below
				return
			}
			if h != nil || err != nil {
				s.inbox.put(item{r: r, h: h, err: err}, r.stop)
			}
			continue // when the put was cut short, r stopped: see above
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) && s.gone(r) {
			// A pull on a consumer that no longer exists gets no answer
			// at all: the heartbeats stop.
			err = jetstream.ErrConsumerNotFound
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			notice, ferr := s.reopen(r, err)
			if ferr == nil {
				if notice != nil {
					s.inbox.put(item{r: r, err: notice}, r.stop)
				}
				continue
			}
			err = ferr
		}
		if !s.inbox.put(item{r: r, err: err}, r.stop) {
			continue
		}
		if errors.Is(classify(err), driver.ErrNotFound) || errors.Is(classify(err), driver.ErrClosed) || s.c.nc.IsClosed() {
			return
		}
		if r.exclusive {
			// A partition's reader may have lost deliveries with its
			// iterator (what it buffered, and what its pull request
			// still takes until the server sees it gone): they would
			// come back after ack_wait, behind newer messages of the
			// lane. So the member gives the lane up instead, and claims
			// it again from its first message not acknowledged.
			s.part.abandon(r, err)
			return
		}
		// Not terminal: start a new iterator after a pause.
		failures++
		select {
		case <-time.After(min(time.Duration(failures)*250*time.Millisecond, 5*time.Second)):
		case <-r.stop:
			return
		}
		it.Stop()
		if next, err := s.messages(r.consumer()); err == nil {
			r.replace(nil, next)
		}
	}
}

// replace installs r's new iterator (and consumer, when not nil); it
// stops the iterator at once when r was stopped meanwhile.
func (r *reader) replace(cons jetstream.Consumer, it jetstream.MessagesContext) {
	r.itMu.Lock()
	defer r.itMu.Unlock()
	if cons != nil {
		r.cons = cons
	}
	r.it = it
	if r.stopped.Load() {
		it.Stop()
	}
}

// gone reports whether r's consumer no longer exists.
func (s *sub) gone(r *reader) bool {
	ctx, cancel := context.WithTimeout(context.Background(), pullExpiry)
	defer cancel()
	_, err := r.consumer().Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound)
}

// errReopened marks the notice that a deleted consumer was created again.
var errReopened = errors.New("created again at the group's recorded position")

// reopen creates r's consumer again after it was deleted behind the
// group's back (at the group's recorded position; see sub.consumer) and
// starts reading it. Deliveries pulled from the deleted consumer cannot
// be acknowledged any more; the new one delivers them again (a
// partition's reader hands the copies' acknowledgements to the deliveries
// it holds; see sub.hold). It returns a notice for the engine's log (nil
// when r stopped or its lease ran out meanwhile: the lane's next owner
// resets the consumer), or the reason the consumer could not be created
// (the stream is gone, or the group is a throwaway one).
func (s *sub) reopen(r *reader, cause error) (notice, err error) {
	if !r.valid(time.Now()) {
		r.halt(false)
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	cons, err := s.consumer(ctx, r.lane)
	if err != nil {
		if s.pos == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("natsbus: receive %q lane %s: %w: %w", s.topic, r.lane, classify(cause), err)
		}
		// The server may still be removing it: the pump tries again.
		return nil, fmt.Errorf("natsbus: receive %q lane %s: %v; creating it again failed, trying again: %v", s.topic, r.lane, cause, err)
	}
	it, err := s.messages(cons)
	if err != nil {
		return nil, fmt.Errorf("natsbus: receive %q lane %s: consumer created again: %w", s.topic, r.lane, err)
	}
	r.itMu.Lock()
	old := r.it
	r.itMu.Unlock()
	old.Stop()
	s.mu.Lock()
	r.dseq = cons.CachedInfo().Delivered.Consumer // a new consumer numbers its deliveries afresh
	s.mu.Unlock()
	r.replace(cons, it)
	return fmt.Errorf("natsbus: receive %q lane %s: consumer %q: %v: %w", s.topic, r.lane, s.consumerName(r.lane), cause, errReopened), nil
}

// halt stops r's iterator. With drain, what it already buffers stays for
// the pump to take (and hand back); without, it is dropped.
func (r *reader) halt(drain bool) {
	if !r.stopped.CompareAndSwap(false, true) {
		return
	}
	close(r.stop)
	r.itMu.Lock()
	defer r.itMu.Unlock()
	if drain {
		r.it.Drain()
	} else {
		r.it.Stop()
	}
}
