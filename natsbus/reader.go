package natsbus

// Readers: one per lane the member reads, and the pump goroutine that
// pulls the lane's consumer (Fetch requests, one at a time), moves what it
// pulls into the inbox, pulls again after an error and re-creates a
// consumer deleted behind the group's back. reader.consMu guards the
// consumer; sub.mu guards what a reader remembers of the sequences it
// pulled and acknowledged.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// reader reads one lane: a durable consumer, pulled by the reader's pump.
type reader struct {
	lane    string
	consMu  sync.Mutex // guards cons, replaced by the pump when it is created again
	cons    jetstream.Consumer
	ctx     context.Context // the pulls'; cancelled by halt without drain, and as the pump returns
	cancel  context.CancelFunc
	halting sync.Once
	stopped atomic.Bool
	drain   atomic.Bool // halted with drain: set before stopped, so that a pump that sees r stopped knows how
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
	r.consMu.Lock()
	defer r.consMu.Unlock()
	return r.cons
}

// failNextRead, set by tests, fails a pump's next read as a missed
// heartbeat would, dropping the message it read.
var failNextRead atomic.Bool

// pullExpiry is how long a pull request waits on the server. A pull
// learns of a request the server dropped without a word (one that
// reached a consumer being deleted: "no responders") only when
// heartbeats stop, after twice pullHeartbeat.
const (
	pullExpiry    = 5 * time.Second
	pullHeartbeat = pullExpiry / 2
)

// pull is one pull request of a reader: a Fetch, whose goroutine (nats.go's)
// reads the request's replies as they come, heartbeats included, into
// msgs, which has room for every message asked for. So nothing a pull
// asked for is ever dropped, however long the pump waits for the engine.
//
// nats.go's other pull, the Messages iterator, buffers its replies in a
// channel exactly as large as the messages it keeps asked for, and the
// server's status messages (idle heartbeats, request timeouts) take room
// in it too: a pump blocked behind a full engine while a heartbeat came
// had the client drop a message of the next full batch as a slow
// consumer, which cost a partition's reader its lane (see errMissed).
type pull struct {
	batch  jetstream.MessageBatch
	msgs   <-chan jetstream.Msg // batch.Messages(), closed once it ended and was emptied
	cancel context.CancelFunc   // ends the request (its context)
	size   int                  // messages asked for
	taken  int                  // messages the pump took from msgs
}

// served reports whether every message p asked for arrived: the server
// no longer holds p's request.
func (p *pull) served() bool { return p.taken+len(p.msgs) >= p.size }

// end ends p's request; what msgs buffers stays for the pump to take.
// Safe on nil.
func (p *pull) end() {
	if p != nil {
		p.cancel()
	}
}

// pullSize is how many messages a pull of s asks for: the engine's
// MaxInFlight. The next pull is asked for only once the pump took the
// last message of the one before (see pump), so a reader buffers no more
// than MaxInFlight messages. Two pulls of MaxInFlight/2 (the next asked
// for once the server sent all of the one before) measured lower in
// BenchmarkConsume (omnibus/raw medians, 100 B and 1 KiB, 2 shared
// cores): 0.77 and 0.83, against 0.82 and 0.83 for one of MaxInFlight
// and 0.82 and 0.95 for the Messages iterator: twice the requests, each
// a subscription and a goroutine of nats.go's.
func (s *sub) pullSize() int { return max(1, s.opts.MaxInFlight) }

// fetch asks r's consumer for the next pullSize messages, and for at most
// MaxInFlightBytes (never less than the largest message the server
// accepts, which would stall the pull). A pinned partition
// consumer is pulled in its priority group.
//
// The request's context ends it early (halt, or the pump giving it up):
// its deadline, a little past pullExpiry, is also how nats.go sizes the
// request's expiry on the server.
func (s *sub) fetch(r *reader) (*pull, error) {
	cons := r.consumer()
	ctx, cancel := context.WithTimeout(r.ctx, pullExpiry+time.Second)
	n := s.pullSize()
	opts := []jetstream.FetchOpt{jetstream.FetchContext(ctx), jetstream.FetchHeartbeat(pullHeartbeat)}
	if b := s.opts.MaxInFlightBytes; b > 0 {
		opts = append(opts, jetstream.FetchMaxBytes(max(b, int(s.c.nc.MaxPayload())+4096)))
	}
	if pinned(cons.CachedInfo()) {
		opts = append(opts, jetstream.FetchPriorityGroup(pinGroup))
	}
	batch, err := cons.Fetch(n, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &pull{batch: batch, msgs: batch.Messages(), cancel: cancel, size: n}, nil
}

func (s *sub) newReader(lane string, cons jetstream.Consumer, exclusive bool) *reader {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reader{lane: lane, cons: cons, ctx: ctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), exclusive: exclusive}
	if exclusive {
		r.nacked = map[uint64]struct{}{}
		r.dseq = cons.CachedInfo().Delivered.Consumer
	}
	return r
}

func (s *sub) startPump(r *reader) {
	s.wg.Add(1)
	go s.pump(r)
}

// pump moves messages from r's pulls to the inbox until r stops, holding
// each from the moment it is pulled. It asks for the next pull as it
// takes the last message of the one before (the server sent it all, and
// it buffers nothing more), so that the request travels while the pump
// hands that message on. Never sooner: besides MaxInFlight, the server
// shares its messages among a consumer's waiting requests in turns, and
// two requests served at once would interleave the lane's messages
// between two buffers, out of order.
// Once r stops, the pump hands back with Nak what its pulls still buffer
// when halted with drain (a member leaving an unpartitioned group), and
// drops it otherwise (the partition's next owner resets its consumer).
func (s *sub) pump(r *reader) {
	defer s.wg.Done()
	defer close(r.done)
	defer r.cancel()
	var cur, next *pull
	defer func() {
		cur.end()
		next.end()
	}()
	// A reconnect loses the pulls' requests on the server, which answers
	// them no more: the pump ends them (what they buffer stays to take)
	// and pulls again, rather than waiting for their heartbeats to stop.
	reconnected := s.c.nc.StatusChanged(nats.CONNECTED)
	defer s.c.nc.RemoveStatusListener(reconnected)
	n := max(1, s.opts.MaxInFlight)
	failures := 0
	for {
		if r.stopped.Load() {
			if r.drain.Load() {
				handBack(cur)
				handBack(next)
			}
			return
		}
		var err error
		switch {
		case cur == nil:
			// A request that could not be sent (the connection is away)
			// pulled nothing, and lost nothing: the pump asks again
			// after a pause, or once the connection is back.
			if cur, err = s.fetch(r); err != nil && !s.c.nc.IsClosed() {
				failures++
				if !s.pause(r, failures, reconnected) {
					return
				}
				continue
			}
		case next == nil && cur.served() && len(cur.msgs)+s.pullSize() <= n:
			next, _ = s.fetch(r) // not sent: asked for again with the next message, or when cur ends
		}
		var msg jetstream.Msg
		if err == nil {
			var ok bool
			select {
			case msg, ok = <-cur.msgs:
			default:
				select { // wait for the next message, a reconnect or halt
				case msg, ok = <-cur.msgs:
				case <-reconnected:
					cur.end()
					next.end()
					continue
				case <-r.stop:
					continue
				}
			}
			if !ok {
				err = cur.batch.Error()
				cur.end()
				cur, next = next, nil
				if err == nil || s.endedQuietly(r, err) {
					continue
				}
			} else {
				cur.taken++
			}
		}
		if r.stopped.Load() {
			if msg != nil && r.drain.Load() {
				_ = msg.Nak()
			}
			continue // the loop's top hands back or drops the rest
		}
		if err == nil && failNextRead.Load() && failNextRead.CompareAndSwap(true, false) {
			err = jetstream.ErrNoHeartbeat // msg dropped, and what the pulls buffer with it
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
		cur.end()
		next.end()
		cur, next = nil, nil
		if (errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders)) && s.gone(r) {
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
			// pull (what the server sent it and the failure kept from
			// arriving): they would come back after ack_wait, behind
			// newer messages of the lane. So the member gives the lane
			// up instead, and claims it again from its first message
			// not acknowledged.
			s.part.abandon(r, err)
			return
		}
		// Not terminal: pull again after a pause.
		failures++
		if !s.pause(r, failures, nil) {
			return
		}
	}
}

// pause waits a little longer after each of failures in a row, up to 5
// seconds, or until reconnected; false when r stopped meanwhile.
func (s *sub) pause(r *reader, failures int, reconnected <-chan nats.Status) bool {
	select {
	case <-time.After(min(time.Duration(failures)*250*time.Millisecond, 5*time.Second)):
		return true
	case <-reconnected:
		return true
	case <-r.stop:
		return false
	}
}

// endedQuietly reports whether a pull that ended with err needs no more
// than the next pull: the server no longer had r pinned (nats.go
// forgot the pin, and the next pull asks for it again), the pull's own
// deadline passed before the server's expiry answer came, or the pump
// ended it after a reconnect. A pull ended by halt ends quietly too: the
// pump sees r stopped.
func (s *sub) endedQuietly(r *reader, err error) bool {
	return errors.Is(err, jetstream.ErrPinIDMismatch) || r.stopped.Load() ||
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && r.ctx.Err() == nil
}

// drainQuiet is how long a pull being handed back gets nothing before
// the pump ends it: what the server sent it before is in by then.
const drainQuiet = 100 * time.Millisecond

// handBack hands back with Nak what p buffers and what its request still
// gets until it is served or quiet for drainQuiet, when the pump ends it.
// Ending it at once would drop what the server sent it and nats.go's
// goroutine did not pass on yet: the server would send it again only
// after ack_wait. What the server sends just as the request ends is still
// lost on the way (as with a subscription drained).
func handBack(p *pull) {
	if p == nil {
		return
	}
	quiet := time.NewTimer(drainQuiet)
	defer quiet.Stop()
	for {
		select {
		case m, ok := <-p.msgs:
			if !ok {
				return
			}
			_ = m.Nak()
			quiet.Reset(drainQuiet)
		case <-quiet.C:
			p.end()
		}
	}
}

// replace installs r's new consumer.
func (r *reader) replace(cons jetstream.Consumer) {
	r.consMu.Lock()
	defer r.consMu.Unlock()
	r.cons = cons
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
	s.mu.Lock()
	r.dseq = cons.CachedInfo().Delivered.Consumer // a new consumer numbers its deliveries afresh
	s.mu.Unlock()
	r.replace(cons)
	return fmt.Errorf("natsbus: receive %q lane %s: consumer %q: %v: %w", s.topic, r.lane, s.consumerName(r.lane), cause, errReopened), nil
}

// halt stops r, and the pump returns. Without drain, r's pulls end at
// once, and what they buffer is dropped; with drain, the pump first
// hands back (Nak) what they buffer and get until they are served or
// quiet (see handBack).
func (r *reader) halt(drain bool) {
	r.halting.Do(func() {
		r.drain.Store(drain)
		r.stopped.Store(true)
		close(r.stop)
		if !drain {
			r.cancel()
		}
	})
}
