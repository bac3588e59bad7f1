package omnibus

// The asynchronous publisher: Publisher.Publish queues a message and
// returns at once; sender goroutines coalesce what is queued into driver
// batches and publish them through Client.publishRetrying, so a batch
// rides through faults as Client.Publish does.
//
// Each topic has Senders queues; a message goes to the queue of its key
// (a hash), so messages of one key leave in the order given, one batch of
// a queue at a time. A queue has at most one sender goroutine, started
// when the queue has work and ending when it is empty. On a transport
// whose client keeps its own window in flight, in order
// (driver.Queuer: Kafka), a sender hands a batch to that window and takes
// the next at once; a goroutine per batch settles it when the client
// reports. Publisher.mu guards every queue, the buffer's counts and
// closed; results are settled and hooks called outside it.

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// ErrFull: a Publisher's buffer is full and it was told not to wait
// (FailWhenFull).
var ErrFull = errors.New("publisher buffer full")

// PublisherOption configures a Publisher.
type PublisherOption func(*publisherConfig) error

type publisherConfig struct {
	count, bytes     int
	linger           time.Duration
	senders          int
	maxMsgs, maxSize int
	failWhenFull     bool
	timeout          time.Duration
}

// BatchSize bounds a batch: at most n messages and b bytes (message
// sizes as the transport counts them; a message larger than b travels
// alone). Default: 1,000 messages, 1 MiB.
func BatchSize(n, b int) PublisherOption {
	return func(c *publisherConfig) error {
		if n < 1 || b < 1 {
			return fmt.Errorf("omnibus: BatchSize(%d, %d): both must be at least 1: %w", n, b, ErrInvalid)
		}
		c.count, c.bytes = n, b
		return nil
	}
}

// Linger is how long a queue waits for more messages before a batch that
// is not full leaves. Default: 0, a batch leaves as soon as its queue's
// previous batch is done, carrying what arrived meanwhile (batches grow
// with the load, and a lone message waits for nothing).
func Linger(d time.Duration) PublisherOption {
	return func(c *publisherConfig) error {
		if d < 0 {
			return fmt.Errorf("omnibus: Linger(%v): negative: %w", d, ErrInvalid)
		}
		c.linger = d
		return nil
	}
}

// Senders is the number of batches per topic that may be in flight at
// once, each for its own share of the keys. Default: 4.
func Senders(n int) PublisherOption {
	return func(c *publisherConfig) error {
		if n < 1 {
			return fmt.Errorf("omnibus: Senders(%d): at least 1: %w", n, ErrInvalid)
		}
		c.senders = n
		return nil
	}
}

// MaxBuffered bounds what the Publisher holds, queued or in flight: at
// most n messages and b bytes. Past the bound Publish waits for room (or
// fails with ErrFull, see FailWhenFull). Default: 100,000 messages,
// 64 MiB.
func MaxBuffered(n, b int) PublisherOption {
	return func(c *publisherConfig) error {
		if n < 1 || b < 1 {
			return fmt.Errorf("omnibus: MaxBuffered(%d, %d): both must be at least 1: %w", n, b, ErrInvalid)
		}
		c.maxMsgs, c.maxSize = n, b
		return nil
	}
}

// FailWhenFull makes Publish fail with ErrFull when the buffer is full,
// instead of waiting for room. Default: wait.
func FailWhenFull() PublisherOption {
	return func(c *publisherConfig) error {
		c.failWhenFull = true
		return nil
	}
}

// PublishTimeout bounds how long a batch is tried, faults ridden through
// included (see Client.Publish). Default: 1 minute.
func PublishTimeout(d time.Duration) PublisherOption {
	return func(c *publisherConfig) error {
		if d <= 0 {
			return fmt.Errorf("omnibus: PublishTimeout(%v): must be positive: %w", d, ErrInvalid)
		}
		c.timeout = d
		return nil
	}
}

// A Publisher publishes asynchronously: Publish queues a message and
// returns a PublishResult at once, so one goroutine can keep thousands of
// messages in flight. Messages given to Publish concurrently or in quick
// succession are coalesced into batches, each published as Client.Publish
// publishes: the client's durability, per-message errors, the same ID
// tried again after ErrRetryable or ErrOutcomeUnknown failures.
//
// Messages of one key are published in the order given: one batch at a
// time for a key, in order within it. A message tried again after a
// fault lands after those of its batch that landed the first time.
// On Kafka a key's batches are instead handed to franz-go's producer one
// after another without waiting, as its own Produce is used: the
// producer keeps them in order, retries included (idempotently at
// durability all), for as long as the delivery_timeout; what it gives up
// on fails, and is not tried again behind the messages sent since.
//
// A Publisher is safe for concurrent use. Close it (or Flush it) before
// the client: what is still queued when the client closes fails with
// ErrClosed.
type Publisher struct {
	c      *Client
	cfg    publisherConfig
	seed   maphash.Seed
	ctx    context.Context // the batches'; cancelled by Close when its ctx ends
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	topics  map[string][]*pubQueue
	next    int           // round robin for messages without a key
	msgs    int           // held: queued or in flight
	size    int           // their bytes
	room    chan struct{} // closed when msgs or size fall; then replaced
	idle    chan struct{} // closed when msgs falls to 0; then replaced
	senders sync.WaitGroup
}

// PublishResult is the outcome of one message given to Publisher.Publish.
// It holds nothing of the message but its ID: a caller keeping thousands
// of results keeps little.
type PublishResult struct {
	id    string
	mu    sync.Mutex
	done  bool
	err   error
	ready chan struct{} // made when asked for before the outcome is known
}

// outgoing is a message in a Publisher, from Publish until its outcome.
type outgoing struct {
	r    *PublishResult
	msg  driver.Message
	size int // msg.Size()
	ctx  context.Context
	end  func(error) // the PublishHooks' ends, or nil
}

// closedReady is what Ready returns once the outcome is known.
var closedReady = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// ID is the message's ID (filled by Publish when empty).
func (r *PublishResult) ID() string { return r.id }

// Ready is closed when the outcome is known.
func (r *PublishResult) Ready() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return closedReady
	}
	if r.ready == nil {
		r.ready = make(chan struct{})
	}
	return r.ready
}

// Err is the outcome once Ready is closed: nil when the message reached
// the client's durability.
func (r *PublishResult) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Get waits for the outcome, or for ctx to end (then it returns ctx's
// error; the message may still land).
func (r *PublishResult) Get(ctx context.Context) error {
	select {
	case <-r.Ready():
		return r.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finish records the outcome.
func (r *PublishResult) finish(err error) {
	r.mu.Lock()
	r.done, r.err = true, err
	if r.ready != nil {
		close(r.ready)
	}
	r.mu.Unlock()
}

// Publisher returns a new asynchronous publisher on the client.
func (c *Client) Publisher(opts ...PublisherOption) (*Publisher, error) {
	cfg := publisherConfig{count: 1000, bytes: 1 << 20, senders: 4, maxMsgs: 100_000, maxSize: 64 << 20, timeout: time.Minute}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := c.checkOpen("publisher", ""); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Publisher{
		c: c, cfg: cfg, seed: maphash.MakeSeed(), ctx: ctx, cancel: cancel,
		topics: map[string][]*pubQueue{},
		room:   make(chan struct{}), idle: make(chan struct{}),
	}, nil
}

// Publish queues m for topic and returns its result. It fills an empty ID
// and a zero Time in m; m must not be changed until the result is ready.
// The error is for a message that cannot be queued: an invalid one
// (ErrInvalid), a closed Publisher (ErrClosed), a full buffer with
// FailWhenFull (ErrFull), or ctx ending while Publish waits for room. A
// message whose ctx ends before its batch leaves is not sent and fails
// with ctx's error; once sent, it is tried until it lands, fails, or
// PublishTimeout passes.
func (p *Publisher) Publish(ctx context.Context, topic string, m *Message) (*PublishResult, error) {
	ms := [1]*Message{m}
	if err := p.c.prepare(topic, ms[:], time.Now()); err != nil {
		return nil, err
	}
	o := outgoing{r: &PublishResult{id: m.ID}, ctx: ctx}
	if hs := p.c.hooks.publish; len(hs) > 0 {
		// Hooks see each message as a Publish of one, with its own
		// context (a trace's parent), before it is queued.
		ctx, o.end = wrap(ctx, hs, func(h PublishHook, ctx context.Context) (context.Context, func(error)) {
			return h.OnPublish(ctx, topic, ms[:])
		})
		o.ctx = ctx
	}
	o.msg = toDriver(m)
	o.size = o.msg.Size()
	if err := p.enqueue(ctx, topic, m.Key, &o); err != nil {
		if o.end != nil {
			o.end(err)
		}
		return nil, err
	}
	return o.r, nil
}

// enqueue waits for room, then queues a copy of o, starting or arming
// its queue's sender.
func (p *Publisher) enqueue(ctx context.Context, topic, key string, o *outgoing) error {
	size := o.size
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return fmt.Errorf("omnibus: publish %q: publisher: %w", topic, ErrClosed)
		}
		// A message larger than the whole buffer is let in alone.
		if p.msgs == 0 || p.msgs < p.cfg.maxMsgs && p.size+size <= p.cfg.maxSize {
			break
		}
		if p.cfg.failWhenFull {
			p.mu.Unlock()
			return fmt.Errorf("omnibus: publish %q: %d messages, %d bytes held: %w", topic, p.msgs, p.size, ErrFull)
		}
		if calledFromSettle() {
			p.mu.Unlock()
			return fmt.Errorf("omnibus: publish %q: %d messages, %d bytes held (%w), and called from a PublishHook's end, "+
				"which runs before its messages free their room, it would wait for itself: %w", topic, p.msgs, p.size, ErrFull, ErrInvalid)
		}
		room := p.room
		p.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return fmt.Errorf("omnibus: publish %q: waiting for room in the publisher: %w", topic, ctx.Err())
		}
		p.mu.Lock()
	}
	qs := p.topics[topic]
	if qs == nil {
		qs = make([]*pubQueue, p.cfg.senders)
		for i := range qs {
			qs[i] = &pubQueue{topic: topic}
		}
		p.topics[topic] = qs
	}
	var q *pubQueue
	if key == "" {
		q = qs[p.next%len(qs)]
		p.next++
	} else {
		q = qs[maphash.String(p.seed, key)%uint64(len(qs))]
	}
	q.push(o, p.cfg.count, p.cfg.bytes)
	p.msgs++
	p.size += size
	p.kickLocked(q)
	p.mu.Unlock()
	return nil
}

// kickLocked starts q's sender when a batch is due: the queue holds a
// full batch, or there is no linger; otherwise it arms the linger timer.
func (p *Publisher) kickLocked(q *pubQueue) {
	if q.running || q.n == 0 {
		return
	}
	if p.cfg.linger > 0 && q.n < p.cfg.count && q.bytes < p.cfg.bytes && !p.closed {
		if q.timer == nil {
			q.timer = time.AfterFunc(p.cfg.linger, func() {
				p.mu.Lock()
				q.timer = nil
				p.startLocked(q)
				p.mu.Unlock()
			})
		}
		return
	}
	p.startLocked(q)
}

func (p *Publisher) startLocked(q *pubQueue) {
	if q.running || q.n == 0 {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	q.running = true
	p.senders.Add(1)
	go p.send(q)
}

// send publishes q's batches until q is empty. On a transport that keeps
// its own window of publishes in flight (driver.Queuer) a batch is
// queued there and the next taken at once; otherwise each batch is
// published, and waited for, in turn.
func (p *Publisher) send(q *pubQueue) {
	defer p.senders.Done()
	queuer, _ := p.c.conn.(driver.Queuer)
	for {
		p.mu.Lock()
		if q.n == 0 {
			q.running = false
			p.mu.Unlock()
			return
		}
		batch, bytes, own := q.take()
		p.mu.Unlock()
		if queuer != nil && p.queue(queuer, q.topic, batch, bytes, own) {
			continue
		}
		errs := p.publish(q.topic, batch)
		p.settle(batch, bytes, errs)
		dropBatch(batch, own)
	}
}

// publish publishes batch, leaving out what its contexts gave up on, and
// returns each message's outcome.
func (p *Publisher) publish(topic string, batch []outgoing) []error {
	send, index, errs := p.sendable(topic, batch)
	if len(send) > 0 {
		ctx, cancel := context.WithTimeout(p.ctx, p.cfg.timeout)
		err := p.c.publishRetrying(ctx, topic, send, driver.PublishOptions{Durability: p.c.durability}, true)
		cancel()
		errs = outcomes(topic, len(batch), index, errs, err)
	}
	return errs
}

// queue hands batch to queuer and returns at once; a goroutine settles
// the batch when queuer reports its outcome, then recycles its array if
// the batch owns it (queuer is done with it). false: nothing was queued
// (the batch is then published the common way, which rides through what
// kept it out).
func (p *Publisher) queue(queuer driver.Queuer, topic string, batch []outgoing, bytes int, own bool) bool {
	send, index, errs := p.sendable(topic, batch)
	if len(send) == 0 {
		p.settle(batch, bytes, errs)
		dropBatch(batch, own)
		return true
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.timeout)
	p.senders.Add(1) // Close waits for the outcome
	err := p.c.queue(ctx, queuer, topic, send, driver.PublishOptions{Durability: p.c.durability}, func(err error) {
		cancel()
		// Settled on a goroutine of its own: hooks and whoever waits on
		// a result must not hold up the transport's client.
		go func() {
			defer p.senders.Done()
			p.settle(batch, bytes, outcomes(topic, len(batch), index, errs, err))
			dropBatch(batch, own)
		}()
	})
	if err != nil {
		cancel()
		p.senders.Done()
		return false
	}
	return true
}

// sendable returns the messages of batch to send, their positions in
// batch in index, and the outcomes already known: of the messages whose
// contexts gave up before the batch left. index and errs are nil when
// every message is sent (the common case: two arrays fewer a batch).
func (p *Publisher) sendable(topic string, batch []outgoing) (send []*driver.Message, index []int, errs []error) {
	send = make([]*driver.Message, 0, len(batch))
	for i := range batch {
		o := &batch[i]
		if err := o.ctx.Err(); err != nil {
			if errs == nil {
				errs = make([]error, len(batch))
				index = make([]int, len(send), len(batch))
				for j := range index {
					index[j] = j
				}
			}
			errs[i] = fmt.Errorf("omnibus: publish %q: message %q not sent: %w", topic, o.r.id, err)
			continue
		}
		send = append(send, &o.msg)
		if index != nil {
			index = append(index, i)
		}
	}
	return send, index, errs
}

// outcomes sets the outcomes of a batch of n messages, errs (nil: none
// known yet), from the publish's error for the messages sent, at index's
// positions (nil: every message was), and returns them (nil: all
// landed).
func outcomes(topic string, n int, index []int, errs []error, err error) []error {
	if err == nil {
		return errs
	}
	if errs == nil {
		errs = make([]error, n)
	}
	at := func(i int) int {
		if index == nil {
			return i
		}
		return index[i]
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		for _, f := range pe.Failed {
			errs[at(f.Index)] = fmt.Errorf("omnibus: publish %q: message %q: %w", topic, f.ID, f.Err)
		}
		return errs
	}
	if index == nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for _, i := range index {
		errs[i] = err
	}
	return errs
}

// settle gives every result of batch its outcome (errs; nil: every
// message landed) and releases the batch's room in the buffer.
func (p *Publisher) settle(batch []outgoing, bytes int, errs []error) {
	for i := range batch {
		o := &batch[i]
		var err error
		if errs != nil {
			err = errs[i]
		}
		o.r.finish(err)
		if o.end != nil {
			o.end(err)
		}
	}
	p.mu.Lock()
	p.msgs -= len(batch)
	p.size -= bytes
	close(p.room)
	p.room = make(chan struct{})
	if p.msgs == 0 {
		close(p.idle)
		p.idle = make(chan struct{})
	}
	p.mu.Unlock()
}

// reentered is the error of a call that would wait for the goroutine
// it runs on.
func reentered(op string) error {
	return fmt.Errorf("omnibus: publisher %s: called from a PublishHook's end, which runs before its messages "+
		"are done with, it would wait for itself: %w", op, ErrInvalid)
}

// Flush starts every queued batch at once (lingers cut short) and waits
// until nothing is held: every message given before Flush, and during
// it, has its outcome. It returns ctx's error if ctx ends first. Called
// from a PublishHook's end, it fails at once with an error wrapping
// ErrInvalid (it would wait for itself), as Close does.
func (p *Publisher) Flush(ctx context.Context) error {
	if calledFromSettle() {
		return reentered("flush")
	}
	p.mu.Lock()
	for _, qs := range p.topics {
		for _, q := range qs {
			p.startLocked(q)
		}
	}
	if p.msgs == 0 {
		p.mu.Unlock()
		return nil
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("omnibus: publisher flush: %w", ctx.Err())
	}
}

// Close stops the Publisher taking messages, publishes what it holds, and
// waits for their outcomes. If ctx ends first, the batches in flight are
// cancelled (their messages fail, of unknown outcome where they were
// sent) and Close returns ctx's error once every sender has ended.
// Close is idempotent.
func (p *Publisher) Close(ctx context.Context) error {
	if calledFromSettle() {
		return reentered("close")
	}
	p.mu.Lock()
	p.closed = true
	close(p.room) // wakes Publish calls waiting for room: they fail
	p.room = make(chan struct{})
	p.mu.Unlock()
	err := p.Flush(ctx)
	if err != nil {
		p.cancel()
	}
	p.senders.Wait()
	p.cancel()
	return err
}
