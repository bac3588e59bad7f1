package natsbus

// Readers: one per lane the member reads, and the pump goroutine that
// pulls the lane's consumer (its own pull requests, answered on one
// subscription), moves what it pulls into the inbox, pulls again after
// an error and re-creates a consumer deleted behind the group's back.
// reader.consMu guards the consumer; sub.mu guards what a reader
// remembers of the sequences it pulled and acknowledged.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	// first and last are r's held deliveries by stream sequence, lowest
	// first (a list through held.lnext, kept by heldList): Ack finds a
	// lane's lowest unsettled sequence without walking the held set.
	// Partitions' readers only; guarded by sub.mu.
	first, last *held
	// pin is the pin the server gave r's pulls of a pinned partition
	// consumer (the Nats-Pin-Id of their messages), asked for by the next
	// request. The pump's.
	pin string
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

// pullExpiry is how long a pull request waits on the server. A reader
// learns of a request the server dropped without a word (one that
// reached a consumer being deleted: "no responders") only when
// heartbeats stop, after twice pullHeartbeat.
const (
	pullExpiry    = 5 * time.Second
	pullHeartbeat = pullExpiry / 2
)

// pullSize is how many messages a reader keeps asked for and not yet
// handed on: the engine's MaxInFlight.
func (s *sub) pullSize() int { return max(1, s.opts.MaxInFlight) }

// pull is a run of a reader's pull requests, all answered on one
// subscription: the server's replies to every request arrive in the
// order it sends them, so the lane's order holds however it shares its
// messages among the requests (it serves waiting requests in turns: two
// Fetches, each a subscription of its own, split the lane between two
// buffers). The subscription's callback only queues what arrives (it
// never waits), so the client never drops a reply as a slow consumer;
// the queue holds no more than the requests asked for (and their status
// messages). The pump takes from the queue and does all the rest: it
// counts what the requests still owe (a message does not tell which
// request it answers, but a request that ends unserved says how many it
// still owed), asks for more once at most half of pullSize is owed (so
// the next request travels while the pump hands on the rest), and
// watches the heartbeats.
//
// nats.go's callback pull (Consumer.Consume) does the same on one
// subscription, but skips asking for more while its goroutine is still
// sending the request before, and does not look again: when the
// callback handled all that was owed in that window (a few milliseconds
// on 2 busy cores), nothing more was asked for, and the reader stalled
// until the heartbeat check gave up (5 s, about 1 run in 10 of
// BenchmarkConsume). Here the pump both asks and counts.
type pull struct {
	sub    *nats.Subscription
	inbox  string
	heard  atomic.Uint64 // replies arrived, idle heartbeats included
	mu     sync.Mutex
	queue  []*nats.Msg // arrived, not taken by the pump
	closed bool        // unsubscribed: what still arrives is handed back (drain) or dropped
	drain  bool
	ready  chan struct{} // something arrived in an empty queue

	owed int // the pump's: messages asked for and not taken yet, nor given up by the server
}

// arrive is p's subscription's callback.
func (p *pull) arrive(m *nats.Msg) {
	p.heard.Add(1)
	if len(m.Data) == 0 && m.Header.Get("Status") == "100" {
		return // an idle heartbeat
	}
	p.mu.Lock()
	if p.closed {
		drain := p.drain
		p.mu.Unlock()
		if drain && userMsg(m) {
			_ = m.Nak()
		}
		return
	}
	p.queue = append(p.queue, m)
	if len(p.queue) == 1 {
		driver.Notify(p.ready)
	}
	p.mu.Unlock()
}

// userMsg reports whether m is a message of the stream, not a status.
func userMsg(m *nats.Msg) bool {
	return len(m.Data) > 0 || m.Header.Get("Status") == ""
}

// take moves what p queued to the end of buf.
func (p *pull) take(buf []*nats.Msg) []*nats.Msg {
	p.mu.Lock()
	defer p.mu.Unlock()
	buf = append(buf, p.queue...)
	clear(p.queue)
	p.queue = p.queue[:0]
	return buf
}

// close unsubscribes p. With drain, what is queued and what still
// arrives is handed back with Nak; without, it is dropped (the server
// sends it again after ack_wait).
func (p *pull) close(drain bool) {
	p.mu.Lock()
	p.closed, p.drain = true, drain
	rest := p.queue
	p.queue = nil
	p.mu.Unlock()
	_ = p.sub.Unsubscribe()
	if drain {
		for _, m := range rest {
			if userMsg(m) {
				_ = m.Nak()
			}
		}
	}
}

// openPull subscribes to a new inbox for r's pull requests.
func (s *sub) openPull() (*pull, error) {
	p := &pull{inbox: s.c.nc.NewInbox(), ready: make(chan struct{}, 1)}
	sub, err := s.c.nc.Subscribe(p.inbox, p.arrive)
	if err != nil {
		return nil, err
	}
	// The queue is bounded by what p asks for; the callback never waits.
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	return p, nil
}

// pullRequest is the body of a pull request
// ($JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>).
type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires,omitempty"`
	MaxBytes  int           `json:"max_bytes,omitempty"`
	Heartbeat time.Duration `json:"idle_heartbeat,omitempty"`
	Group     string        `json:"group,omitempty"`
	PinID     string        `json:"id,omitempty"`
}

// ask sends a request on p for what r's pulls miss of pullSize, unless
// more than half of pullSize is owed. Each asks for at most
// max(MaxInFlightBytes, max_payload + 4 KiB) bytes (never less than the
// largest message the server accepts, which would stall it). A pinned
// partition consumer is pulled in its priority group, with the pin the
// server gave r.
func (s *sub) ask(r *reader, p *pull) error {
	n := s.pullSize()
	if p.owed > n/2 {
		return nil
	}
	info := r.consumer().CachedInfo()
	req := pullRequest{Batch: n - p.owed, Expires: pullExpiry, Heartbeat: pullHeartbeat}
	if b := s.opts.MaxInFlightBytes; b > 0 {
		req.MaxBytes = max(b, int(s.c.nc.MaxPayload())+4096)
	}
	if pinned(info) {
		req.Group, req.PinID = pinGroup, r.pin
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := s.c.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+info.Stream+"."+info.Name, p.inbox, body); err != nil {
		return err
	}
	p.owed = n
	return nil
}

// got counts a message taken. One of no request still counted (asked
// for before a reconnect, say) is a delivery all the same.
func (p *pull) got() { p.owed = max(0, p.owed-1) }

// ended counts what the request a status message m ended still owed.
func (p *pull) ended(m *nats.Msg) {
	left, _ := strconv.Atoi(m.Header.Get("Nats-Pending-Messages"))
	p.owed = max(0, p.owed-left)
}

// status handles a status message: nil when it ended a request (expired,
// served as far as its bytes allowed, or the server forgot r's pin or
// changed the consumer's leader), the failure it tells otherwise.
func (p *pull) status(r *reader, m *nats.Msg) error {
	code, descr := m.Header.Get("Status"), m.Header.Get("Description")
	switch d := strings.ToLower(descr); {
	case code == "408" || code == "404" || code == "409" && (strings.Contains(d, "exceeds maxbytes") || strings.Contains(d, "batch completed")):
		p.ended(m)
	case code == "423":
		r.pin = "" // the next request asks for a pin again
		p.ended(m)
	case code == "409" && strings.Contains(d, "leadership change"):
		p.owed = 0 // the new leader has none of them
	case code == "409" && strings.Contains(d, "consumer deleted"):
		return jetstream.ErrConsumerDeleted
	case code == "409" && strings.Contains(d, "server shutdown"):
		return jetstream.ErrServerShutdown
	case code == "400":
		return jetstream.ErrBadRequest
	case code == "503":
		return nats.ErrNoResponders
	default:
		return fmt.Errorf("nats: pull request: %s %s", code, descr)
	}
	return nil
}

// drainQuiet is how long a pull being handed back gets nothing before
// the pump ends it.
const drainQuiet = 100 * time.Millisecond

// handBack hands back with Nak what p buffers and what its open requests
// still get, asking for nothing more, until they are served or p is
// quiet for drainQuiet; then it unsubscribes. What the server sends just
// as p unsubscribes is still lost on the way (as with a subscription
// drained): it comes back after ack_wait.
func (p *pull) handBack(r *reader) {
	quiet := time.NewTimer(drainQuiet)
	defer quiet.Stop()
	var batch []*nats.Msg
	for p.owed > 0 {
		batch = p.take(batch[:0])
		for _, m := range batch {
			p.giveBack(r, m, true)
		}
		if len(batch) > 0 {
			quiet.Reset(drainQuiet)
			continue
		}
		select {
		case <-p.ready:
		case <-quiet.C:
			p.close(true)
			return
		}
	}
	p.close(true)
}

// giveBack counts m, a reply taken once r stopped, without holding it: a
// status ends what its request owed, a message is given back with Nak
// when drain, else dropped (the server sends it again after ack_wait).
func (p *pull) giveBack(r *reader, m *nats.Msg, drain bool) {
	if !userMsg(m) {
		_ = p.status(r, m)
		return
	}
	p.got()
	if drain {
		_ = m.Nak()
	}
}

// jsMsg is a delivery read from a pull's subscription, as jetstream.Msg:
// nats.Msg's JetStream methods (the ack subject is the delivery's reply
// subject).
type jsMsg struct{ m *nats.Msg }

func (j jsMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := j.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}
func (j jsMsg) Data() []byte                        { return j.m.Data }
func (j jsMsg) Headers() nats.Header                { return j.m.Header }
func (j jsMsg) Subject() string                     { return j.m.Subject }
func (j jsMsg) Reply() string                       { return j.m.Reply }
func (j jsMsg) Ack() error                          { return j.m.Ack() }
func (j jsMsg) DoubleAck(ctx context.Context) error { return j.m.AckSync(nats.Context(ctx)) }
func (j jsMsg) Nak() error                          { return j.m.Nak() }
func (j jsMsg) NakWithDelay(d time.Duration) error  { return j.m.NakWithDelay(d) }
func (j jsMsg) InProgress() error                   { return j.m.InProgress() }
func (j jsMsg) Term() error                         { return j.m.Term() }
func (j jsMsg) TermWithReason(reason string) error {
	return j.m.Respond([]byte("+TERM " + reason))
}

func (s *sub) newReader(lane string, cons jetstream.Consumer, exclusive bool) *reader {
	r := &reader{lane: lane, cons: cons, stop: make(chan struct{}), done: make(chan struct{}), exclusive: exclusive}
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

// pump reads r's consumer until r stops: it opens a pull (see pull),
// asks for messages and moves what arrives into the inbox, holding each
// from the moment it takes it. A failed pull is closed, and what it
// buffers dropped; the pump reports the failure and opens another, or
// gives up. A reconnect loses the open requests on the server, which
// answers them no more: the pump forgets them and asks again. Once r
// stops, the pump hands back with Nak what the pull buffers and gets
// when halted with drain (a member leaving an unpartitioned group), and
// drops it otherwise (the partition's next owner resets its consumer).
func (s *sub) pump(r *reader) {
	defer s.wg.Done()
	defer close(r.done)
	reconnected := s.c.nc.StatusChanged(nats.CONNECTED)
	defer s.c.nc.RemoveStatusListener(reconnected)
	failures := 0
	for {
		if r.stopped.Load() {
			return
		}
		p, err := s.openPull()
		if err == nil {
			var got bool
			got, err = s.read(r, p, reconnected)
			if got {
				failures = 0
			}
			if r.stopped.Load() {
				if r.drain.Load() {
					p.handBack(r)
				} else {
					p.close(false)
				}
				return
			}
			p.close(false)
			if errors.Is(err, errMissed) {
				s.part.abandon(r, err) // see the exclusive reader's failed read below
				return
			}
		} else if !s.c.nc.IsClosed() {
			// Not subscribed (the connection is away): nothing was
			// pulled, and nothing lost. The pump tries again after a
			// pause, or once the connection is back.
			failures++
			if !s.pause(r, failures, reconnected) {
				return
			}
			continue
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders) {
			// A pull on a consumer that no longer exists gets no
			// answer at all: the heartbeats stop.
			if s.gone(r) {
				err = jetstream.ErrConsumerNotFound
			}
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

// read moves what p pulls into the inbox until r stops (it returns a
// nil error) or p fails: the failure, or errMissed. got reports whether
// it held a message.
func (s *sub) read(r *reader, p *pull, reconnected <-chan nats.Status) (got bool, err error) {
	var batch []*nats.Msg
	wait := time.NewTimer(2 * pullHeartbeat)
	defer wait.Stop()
	for {
		if r.stopped.Load() {
			return got, nil
		}
		if err := s.ask(r, p); err != nil {
			return got, err
		}
		batch = p.take(batch[:0])
		for i, m := range batch {
			batch[i] = nil
			if r.stopped.Load() {
				p.giveBack(r, m, r.drain.Load()) // and the pump the rest
				continue
			}
			if !userMsg(m) {
				if err := p.status(r, m); err != nil {
					return got, err
				}
				if err := s.ask(r, p); err != nil {
					return got, err
				}
				continue
			}
			p.got()
			if err := s.ask(r, p); err != nil {
				return got, err
			}
			if failNextRead.Load() && failNextRead.CompareAndSwap(true, false) {
				return got, jetstream.ErrNoHeartbeat // m dropped, and what p buffers with it
			}
			if pin := m.Header.Get("Nats-Pin-Id"); pin != "" {
				r.pin = pin
			}
			got = true
			h, err := s.hold(r, jsMsg{m})
			if errors.Is(err, errMissed) {
				return got, err
			}
			if h != nil || err != nil {
				s.inbox.put(item{r: r, h: h, err: err}, r.stop) // when cut short, r stopped: see pump
			}
		}
		if len(batch) > 0 {
			continue
		}
		// Wait for the next reply, a reconnect or halt. Nothing at all
		// for twice the heartbeat while requests are open: the server
		// forgot them, or the connection is dead.
		heard := p.heard.Load()
		wait.Reset(2 * pullHeartbeat)
		select {
		case <-p.ready:
		case <-reconnected:
			p.owed = 0
		case <-r.stop:
		case <-wait.C:
			if p.heard.Load() == heard && p.owed > 0 {
				return got, jetstream.ErrNoHeartbeat
			}
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
	r.pin = ""
	r.replace(cons)
	return fmt.Errorf("natsbus: receive %q lane %s: consumer %q: %v: %w", s.topic, r.lane, s.consumerName(r.lane), cause, errReopened), nil
}

// halt stops r, and the pump returns. Without drain, the pump ends r's
// pull at once, and what it buffers is dropped; with drain, the pump
// first hands back (Nak) what it buffers and gets until its requests are
// served or quiet (see pull.handBack).
func (r *reader) halt(drain bool) {
	r.halting.Do(func() {
		r.drain.Store(drain)
		r.stopped.Store(true)
		close(r.stop)
	})
}

// ackedLocked records that seq was acknowledged: acked is the highest
// sequence so far. Called with sub.mu, so that no update is lost.
func (r *reader) ackedLocked(seq uint64) {
	if seq > r.acked.Load() {
		r.acked.Store(seq)
	}
}
