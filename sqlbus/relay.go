package sqlbus

// The relay: publishes what the outbox holds, lane by lane in insertion
// order, marks it sent in the transaction that locked the lane, and
// cleans up sent messages and old inbox records on a schedule.

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	omnidriver "github.com/omnibus-go/omnibus/driver"
)

// Relay publishes the outbox's messages through an omnibus client. Any
// number of relays (in one process or many) may run on one store: each
// message is published by the relay that locked its lane, so in the
// normal case once; a relay that dies between publishing and committing
// its mark leaves the messages to the next relay, which publishes them
// again with the same IDs (at least once, never lost).
type Relay struct {
	st  Store
	c   *omnibus.Client
	cfg relayConfig

	sig    signal
	topics sync.Map // topic -> struct{}: created with CreateTopic

	published, batches, failures, cleaned atomic.Int64
	unheard                               atomic.Bool // the listener gave up: no notifications
}

type relayConfig struct {
	batch      int
	workers    int
	poll       time.Duration
	notify     bool
	timeout    time.Duration
	cleanEvery time.Duration
	keepSent   time.Duration
	keepInbox  time.Duration
	lanes      int
	log        *slog.Logger
}

// RelayOption configures a Relay.
type RelayOption func(*relayConfig) error

// BatchSize is the most messages of one lane a relay publishes and marks
// in one transaction. Default: 100.
func BatchSize(n int) RelayOption {
	return func(c *relayConfig) error { return setPositive(&c.batch, "batch size", n) }
}

// Workers is how many lanes a relay publishes at once, each in a
// transaction of its own. Default: 4.
func Workers(n int) RelayOption {
	return func(c *relayConfig) error { return setPositive(&c.workers, "workers", n) }
}

// Poll is how often an idle relay looks for messages it was not woken
// for. Default: 100 ms; 1 s on a store that wakes relays (PostgreSQL's
// LISTEN/NOTIFY), where it only catches a notification lost while the
// listening connection reconnected.
func Poll(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if d <= 0 {
			return fmt.Errorf("sqlbus: poll interval %v, want more than 0: %w", d, omnibus.ErrInvalid)
		}
		c.poll = d
		return nil
	}
}

// Notify says whether the relay listens for commits on a store that
// can tell (a Notifier: PostgreSQL). Off, it polls. Default: true.
func Notify(on bool) RelayOption {
	return func(c *relayConfig) error { c.notify = on; return nil }
}

// PublishTimeout bounds one batch's publish; a batch that times out is
// published again. Default: 30 s.
func PublishTimeout(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if d <= 0 {
			return fmt.Errorf("sqlbus: publish timeout %v, want more than 0: %w", d, omnibus.ErrInvalid)
		}
		c.timeout = d
		return nil
	}
}

// Cleanup sets how often the relay deletes sent messages older than
// keepSent and inbox records older than keepInbox. An inbox record must
// outlive every redelivery of its message (the transport's retention):
// a message redelivered after its record is gone is handled again.
// Default: every minute, sent messages kept 1 hour, inbox records 7 days.
func Cleanup(every, keepSent, keepInbox time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if every <= 0 || keepSent < 0 || keepInbox < 0 {
			return fmt.Errorf("sqlbus: cleanup every %v keeping %v and %v: want a positive period and no negative age: %w", every, keepSent, keepInbox, omnibus.ErrInvalid)
		}
		c.cleanEvery, c.keepSent, c.keepInbox = every, keepSent, keepInbox
		return nil
	}
}

// TopicLanes is the lane count of the topics the relay creates
// (omnibus.Client.CreateTopic) before it first publishes to them, as the
// bus does; 0 creates none. Default: 4, the bus's default.
func TopicLanes(n int) RelayOption {
	return func(c *relayConfig) error {
		if n < 0 {
			return fmt.Errorf("sqlbus: topic lanes %d: %w", n, omnibus.ErrInvalid)
		}
		c.lanes = n
		return nil
	}
}

// RelayLogger sets where the relay logs failures. Default: slog.Default().
func RelayLogger(l *slog.Logger) RelayOption {
	return func(c *relayConfig) error {
		if l == nil {
			return fmt.Errorf("sqlbus: nil logger: %w", omnibus.ErrInvalid)
		}
		c.log = l
		return nil
	}
}

func setPositive(dst *int, what string, n int) error {
	if n < 1 {
		return fmt.Errorf("sqlbus: %s %d, want at least 1: %w", what, n, omnibus.ErrInvalid)
	}
	*dst = n
	return nil
}

// NewRelay returns a relay of st's outbox publishing through c. It does
// nothing until Run (or Flush).
func NewRelay(st Store, c *omnibus.Client, opts ...RelayOption) (*Relay, error) {
	if st == nil || c == nil {
		return nil, fmt.Errorf("sqlbus: NewRelay: nil store or client: %w", omnibus.ErrInvalid)
	}
	cfg := relayConfig{batch: 100, workers: 4, notify: true, timeout: 30 * time.Second,
		cleanEvery: time.Minute, keepSent: time.Hour, keepInbox: 7 * 24 * time.Hour, lanes: 4, log: slog.Default()}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	r := &Relay{st: st, c: c, cfg: cfg}
	r.sig.ch = make(chan struct{})
	return r, nil
}

// RelayStats are a relay's counters since NewRelay.
type RelayStats struct {
	Published int64 // messages published and marked sent
	Batches   int64 // transactions that published and marked messages
	Failures  int64 // batches that failed (published again later)
	Cleaned   int64 // sent messages and inbox records deleted
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Published: r.published.Load(), Batches: r.batches.Load(), Failures: r.failures.Load(), Cleaned: r.cleaned.Load()}
}

// Run publishes the outbox until ctx ends, then returns nil once its
// goroutines have: Workers publishing lanes, the listener (on a
// Notifier store) and the cleaner. A batch being published when ctx ends
// is rolled back, and published again by the next relay.
func (r *Relay) Run(ctx context.Context) error {
	poll := r.cfg.poll
	var wg sync.WaitGroup
	if n, ok := r.st.(Notifier); ok && r.cfg.notify && n.Notifies() {
		if poll == 0 {
			poll = time.Second
		}
		wg.Go(func() {
			if err := n.Listen(ctx, r.sig.fire); err != nil && ctx.Err() == nil {
				r.cfg.log.Warn("sqlbus: relay polls: no notifications", "error", err)
				r.unheard.Store(true) // poll at the short interval
			}
		})
	}
	if poll == 0 {
		poll = 100 * time.Millisecond
	}
	for range r.cfg.workers {
		wg.Go(func() { r.work(ctx, poll) })
	}
	wg.Go(func() { r.clean(ctx) })
	wg.Wait()
	return nil
}

// work is a worker: it publishes lanes until none is due, then waits to
// be woken, for the poll interval or for the next scheduled message.
func (r *Relay) work(ctx context.Context, poll time.Duration) {
	failures := 0
	var last time.Time // when this worker last published
	for ctx.Err() == nil {
		woken := r.sig.wait()
		n, busy, err := r.step(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			r.failures.Add(1)
			r.cfg.log.Error("sqlbus: relay", "error", err)
			sleep(ctx, omnidriver.Backoff(failures, 50*time.Millisecond, 5*time.Second))
			continue
		}
		failures = 0
		if n > 0 {
			last = time.Now()
			continue
		}
		d := poll
		if r.unheard.Load() && r.cfg.poll == 0 {
			d = min(d, 100*time.Millisecond)
		}
		if busy || time.Since(last) < hotFor {
			d = min(d, hotPoll) // publishers may not notify: see InsertOutbox
		}
		if due, ok, err := r.st.NextDue(ctx, time.Now()); err == nil && ok {
			d = min(d, max(time.Until(due), time.Millisecond))
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-woken:
		case <-t.C:
		}
		t.Stop()
	}
}

// step publishes one batch of one lane; it returns how many messages it
// published, and whether it found every due lane held by other workers
// or relays (busy: they may leave work behind).
func (r *Relay) step(ctx context.Context) (n int, busy bool, err error) {
	now := time.Now()
	lanes, err := r.st.PendingLanes(ctx, now)
	if err != nil || len(lanes) == 0 {
		return 0, false, err
	}
	// In random order: the workers and relays spread over the lanes.
	rand.Shuffle(len(lanes), func(i, j int) { lanes[i], lanes[j] = lanes[j], lanes[i] })
	// Read committed: no gap locks between relays' marks on MySQL (and
	// PostgreSQL's default); SQLite has one level.
	var opts *sql.TxOptions
	if r.st.Dialect() != SQLite {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := r.st.DB().BeginTx(ctx, opts)
	if err != nil {
		return 0, false, fmt.Errorf("sqlbus: relay: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	lane, ok, err := r.st.LockLane(ctx, tx, lanes)
	if err != nil || !ok {
		return 0, err == nil, err
	}
	rows, err := r.st.LaneRows(ctx, tx, lane, now, r.cfg.batch)
	if err != nil || len(rows) == 0 {
		return 0, false, err
	}
	if err := r.publish(ctx, rows); err != nil {
		return 0, false, err
	}
	// Published: mark even if ctx ended meanwhile, or they go out again.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	if err := r.st.MarkSent(mctx, tx, lane, ids, time.Now()); err != nil {
		return 0, false, err
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("sqlbus: relay: commit lane %d: %w (its messages are published again)", lane, err)
	}
	r.published.Add(int64(len(rows)))
	r.batches.Add(1)
	return len(rows), false, nil
}

// publish publishes rows in order: each run of one topic in one call.
func (r *Relay) publish(ctx context.Context, rows []OutboxRow) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.timeout)
	defer cancel()
	for i := 0; i < len(rows); {
		j := i
		msgs := []*omnibus.Message{}
		for ; j < len(rows) && rows[j].Topic == rows[i].Topic; j++ {
			m := rows[j].Message
			msgs = append(msgs, &m)
		}
		topic := rows[i].Topic
		if err := r.ensureTopic(ctx, topic); err != nil {
			return err
		}
		if err := r.c.Publish(ctx, topic, msgs...); err != nil {
			return fmt.Errorf("sqlbus: relay: %w", err)
		}
		i = j
	}
	return nil
}

func (r *Relay) ensureTopic(ctx context.Context, topic string) error {
	if r.cfg.lanes == 0 {
		return nil
	}
	if _, ok := r.topics.Load(topic); ok {
		return nil
	}
	if err := r.c.CreateTopic(ctx, topic, r.cfg.lanes); err != nil {
		return fmt.Errorf("sqlbus: relay: %w", err)
	}
	r.topics.Store(topic, struct{}{})
	return nil
}

// Flush publishes every message due now and returns when none is left,
// or when ctx ends. Lanes other relays hold are waited for.
func (r *Relay) Flush(ctx context.Context) error {
	for {
		n, _, err := r.step(ctx)
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		lanes, err := r.st.PendingLanes(ctx, time.Now())
		if err != nil || len(lanes) == 0 {
			return err
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// clean deletes sent messages and old inbox records every cleanEvery,
// in bounded deletes, until ctx ends.
func (r *Relay) clean(ctx context.Context) {
	t := time.NewTicker(r.cfg.cleanEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.Clean(ctx); err != nil && ctx.Err() == nil {
			r.cfg.log.Warn("sqlbus: relay cleanup", "error", err)
		}
	}
}

// Clean deletes the sent messages and inbox records older than the
// relay keeps them (see Cleanup) and returns how many it deleted. Run
// calls it on the Cleanup schedule.
func (r *Relay) Clean(ctx context.Context) (int64, error) {
	const chunk = 1000
	var total int64
	now := time.Now()
	for _, del := range []func() (int64, error){
		func() (int64, error) { return r.st.DeleteSent(ctx, now.Add(-r.cfg.keepSent), chunk) },
		func() (int64, error) { return r.st.DeleteInbox(ctx, now.Add(-r.cfg.keepInbox), chunk) },
	} {
		for {
			n, err := del()
			total += n
			r.cleaned.Add(n)
			if err != nil {
				return total, err
			}
			if n < chunk {
				break
			}
		}
	}
	return total, nil
}

// signal wakes every waiting worker at once.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next fire.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	close(s.ch)
	s.ch = make(chan struct{})
	s.mu.Unlock()
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
