package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// sub is one group member.
//
// Goroutines, all owned by the sub and ended by Close: one per lane (it
// opens the lane's channel, declares the lane's topology, consumes, and
// reopens after a drop), and in partitioned mode the rebalancer.
//
// Locks: cbMu serializes Claimed and Revoked and is never taken by
// Receive or Ack (Lost is called without it, so that a lost channel
// reaches the engine at once, not behind another lane's drain); ackMu
// serializes acknowledgement plans and sends (a multiple ack must not
// overtake a single ack of a tag it covers); mu guards the buffer and the
// lanes' channel state. Order: cbMu, ackMu, mu.
type sub struct {
	c        *conn
	link     *link
	topic    string
	group    string
	expires  bool // a throwaway group: its queues go when unused
	part     bool
	quorum   bool
	cb       driver.Lanes
	prefetch int
	lanes    []*lane

	cbMu  sync.Mutex
	ackMu sync.Mutex

	mu   sync.Mutex
	buf  []*driver.Delivery // deliveries of claimed lanes that are not being revoked
	wake chan struct{}
	// revokes counts the starts and ends of Revoked and Lost calls, seen
	// its value when Receive last returned: Receive returns once with
	// nothing each time a revocation starts (the engine waits for a
	// Receive in progress before it revokes, and an idle member's Receive
	// would otherwise hold the revocation for the engine's whole drain
	// bound) and each time one ends (so that a Receive begun before the
	// engine marked the lanes revoked never returns a new claim's
	// deliveries, which the engine would drop). Otherwise it goes on
	// returning the deliveries of the lanes that stay.
	revokes uint64
	seen    uint64
	closed  bool

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// lane is one queue the member consumes, on a channel of its own.
type lane struct {
	s     *sub
	n     int
	id    string
	queue string

	// guarded by s.mu
	ch       *amqp.Channel // nil while down
	gen      uint64        // counts channels
	claimed  bool
	revoking bool
	held     int    // deliveries on ch not yet acknowledged
	low      uint64 // lowest delivery tag on ch not known settled
	settled  []bool // settled[i] is tag low+i
}

// token is a Delivery's handle.
type token struct {
	l   *lane
	gen uint64
	tag uint64
}

// Subscribe implements driver.Conn.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if topic == "" || opts.Group == "" || len(topic)+len(opts.Group)+32 > 255 {
		return nil, fmt.Errorf("rabbitbus: subscribe %q group %q: topic and group must be non-empty and their names together under 224 bytes: %w", topic, opts.Group, driver.ErrInvalid)
	}
	if opts.StartAt == driver.StartEarliest {
		return nil, fmt.Errorf("rabbitbus: subscribe %q: a new group cannot start from the earliest message: %w", topic, driver.ErrUnsupported)
	}
	l, err := c.subLink(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: subscribe %q: %w", topic, err)
	}
	s := &sub{
		c: c, link: l, topic: topic, group: opts.Group, expires: opts.Ephemeral,
		part: c.cfg.partitions > 0, quorum: c.cfg.quorum(),
		cb: opts.Lanes, prefetch: max(1, min(opts.MaxInFlight, math.MaxUint16)),
		wake: make(chan struct{}, 1),
	}
	if s.part {
		// Ordered lanes retry in place: the messages a retrying key holds
		// must not use up the prefetch the lane's other keys need.
		s.prefetch = max(s.prefetch, min(opts.MaxHeld, math.MaxUint16))
	}
	if s.part {
		for p := range c.cfg.partitions {
			s.lanes = append(s.lanes, &lane{s: s, n: p, id: strconv.Itoa(p), queue: partitionQueue(topic, opts.Group, p)})
		}
	} else {
		s.lanes = []*lane{{s: s, id: "0", queue: groupQueue(topic, opts.Group)}}
	}
	// Declare everything once, in lane order (the consistent-hash
	// exchange assigns its buckets in binding order).
	if _, err := c.withChannel(ctx, l, func(ch *amqp.Channel) error {
		for _, ln := range s.lanes {
			if err := ln.declare(ch); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, c.topologyError("subscribe", topic, err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if !c.subs.Add(s) {
		s.cancel()
		return nil, fmt.Errorf("rabbitbus: subscribe %q: %w", topic, driver.ErrClosed)
	}
	for _, ln := range s.lanes {
		s.wg.Add(1)
		go ln.run()
	}
	if s.part {
		s.wg.Add(1)
		go s.rebalance()
	}
	if s.part {
		return &partSub{s}, nil
	}
	return s, nil
}

// partSub is a partitioned-mode member. It has no Nack: a redelivery
// through a retry queue would land behind later messages of its key, so
// the engine retries in place instead.
type partSub struct{ s *sub }

func (p partSub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	return p.s.Receive(ctx, room)
}
func (p partSub) Ack(ctx context.Context, ds []*driver.Delivery) error { return p.s.Ack(ctx, ds) }
func (p partSub) Lag(ctx context.Context) ([]driver.LaneLag, error)    { return p.s.Lag(ctx) }
func (p partSub) Close() error                                         { return p.s.Close() }

var (
	_ driver.Acker     = (*sub)(nil)
	_ driver.Nacker    = (*sub)(nil)
	_ driver.LagReader = (*sub)(nil)
	_ driver.Acker     = partSub{}
	_ driver.LagReader = partSub{}
)

// declare declares the lane's exchange, queue and binding on ch.
func (l *lane) declare(ch *amqp.Channel) error {
	s := l.s
	s.c.record("x", s.topic)
	if err := declareTopic(ch, s.topic); err != nil {
		return err
	}
	args := s.c.queueArgs()
	if s.expires {
		args["x-expires"] = int32(EphemeralExpiry / time.Millisecond)
	}
	src, key := s.topic, "#"
	if s.part {
		hx := hashExchange(s.topic, s.group)
		s.c.record("x", hx)
		if err := ch.ExchangeDeclare(hx, "x-consistent-hash", true, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.ExchangeBind(hx, "#", s.topic, false, nil); err != nil {
			return err
		}
		args["x-single-active-consumer"] = true
		src, key = hx, "1" // weight 1: every partition gets an equal share of keys
	}
	s.c.record("q", l.queue)
	if _, err := ch.QueueDeclare(l.queue, true, false, false, false, args); err != nil {
		return err
	}
	return ch.QueueBind(l.queue, key, src, false, nil)
}

// run keeps the lane consuming until Close.
func (l *lane) run() {
	s := l.s
	defer s.wg.Done()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(backoff(attempt))
			select {
			case <-s.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		ac, _, err := s.link.get(s.ctx)
		if err != nil {
			return
		}
		ch, dels, err := l.open(ac)
		if err != nil {
			if s.ctx.Err() == nil && attempt%10 == 1 {
				s.c.log.Warn("consuming failed, retrying", "queue", l.queue, "err", err)
			}
			continue
		}
		attempt = 0
		l.serve(ch, dels)
		if s.ctx.Err() != nil {
			return
		}
	}
}

func (l *lane) open(ac *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := ac.Channel()
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*amqp.Channel, <-chan amqp.Delivery, error) {
		_ = ch.Close()
		return nil, nil, err
	}
	if err := l.declare(ch); err != nil {
		return fail(err)
	}
	if err := ch.Qos(l.s.prefetch, 0, false); err != nil {
		return fail(err)
	}
	dels, err := ch.Consume(l.queue, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	return ch, dels, nil
}

// serve moves the channel's deliveries to the buffer until it closes.
func (l *lane) serve(ch *amqp.Channel, dels <-chan amqp.Delivery) {
	s := l.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ch.Close()
		for range dels {
		}
		return
	}
	l.ch = ch
	l.gen++
	gen := l.gen
	l.claimed, l.revoking = false, false
	l.held, l.low, l.settled = 0, 1, l.settled[:0]
	s.mu.Unlock()
	if !s.part {
		s.claim(l, gen) // the queue's one lane is ours while we consume it
	}
	for d := range dels {
		s.accept(l, gen, &d)
	}
	s.mu.Lock()
	lost := l.claimed
	l.claimed = false
	l.ch = nil
	l.held = 0
	s.dropLocked(l)
	s.mu.Unlock()
	_ = ch.Close()
	if lost {
		// Not behind cbMu: a Revoked of another lane may hold it for the
		// engine's drain bound. The lane's next claim comes from this
		// goroutine, after Lost returns.
		s.revoke(func() { s.cb.Lost([]string{l.id}) })
	}
}

// revoke runs fn, a call of Lanes.Revoked or Lanes.Lost, making a Receive
// in progress return when fn starts and when it ends (see sub.revokes).
func (s *sub) revoke(fn func()) {
	s.bump()
	fn()
	s.bump()
}

func (s *sub) bump() {
	s.mu.Lock()
	s.revokes++
	s.mu.Unlock()
	driver.Notify(s.wake)
}

// claim announces lane l of channel generation gen, once.
func (s *sub) claim(l *lane, gen uint64) {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	s.mu.Lock()
	ok := l.gen == gen && l.ch != nil && !l.claimed && !l.revoking && !s.closed
	s.mu.Unlock()
	if !ok {
		return
	}
	s.cb.Claimed([]string{l.id})
	s.mu.Lock()
	if l.gen == gen {
		l.claimed = true
	}
	s.mu.Unlock()
}

func (s *sub) accept(l *lane, gen uint64, d *amqp.Delivery) {
	s.mu.Lock()
	need := !l.claimed && !l.revoking
	s.mu.Unlock()
	if need {
		// RabbitMQ 3.10 does not tell a consumer that it became the single
		// active one; its first delivery does.
		s.claim(l, gen)
	}
	msg, attempt := decode(d, s.quorum)
	dl := &driver.Delivery{
		Message:  msg,
		Lane:     l.id,
		Position: strconv.FormatUint(d.DeliveryTag, 10),
		Attempt:  attempt,
		Token:    &token{l: l, gen: gen, tag: d.DeliveryTag},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.gen != gen {
		return
	}
	l.held++
	for uint64(len(l.settled)) < d.DeliveryTag-l.low+1 {
		l.settled = append(l.settled, false)
	}
	if l.claimed && !l.revoking && !s.closed {
		s.buf = append(s.buf, dl)
		driver.Notify(s.wake)
	}
	// Otherwise the delivery stays unacknowledged until the channel
	// closes, and the server delivers it again.
}

// dropLocked removes lane l's deliveries from the buffer.
func (s *sub) dropLocked(l *lane) {
	keep := s.buf[:0]
	for _, d := range s.buf {
		if d.Token.(*token).l != l {
			keep = append(keep, d)
		}
	}
	clear(s.buf[len(keep):])
	s.buf = keep
}

// Receive implements driver.Subscriber. It returns the deliveries of the
// lanes the member holds and is not handing over, also while other lanes
// are being revoked; it returns once with nothing when a revocation
// starts and when one ends (see sub.revokes).
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("rabbitbus: receive %q: %w", s.topic, driver.ErrClosed)
		}
		if s.seen != s.revokes {
			// Before the buffer: deliveries go out only from a Receive
			// that no revocation started or ended during (nor since the
			// last Receive returned), so the engine never takes one of a
			// lane it revoked after it began this Receive.
			s.seen = s.revokes
			s.mu.Unlock()
			return nil, nil
		}
		if len(s.buf) > 0 {
			n, bytes := 0, 0
			for ; n < len(s.buf); n++ {
				size := s.buf[n].Size()
				if !room.Fits(n, bytes, size) {
					break
				}
				bytes += size
			}
			if n == 0 {
				s.mu.Unlock()
				return nil, nil // the first waiting does not fit
			}
			out := make([]*driver.Delivery, n)
			copy(out, s.buf)
			clear(s.buf[:n])
			s.buf = s.buf[n:]
			if len(s.buf) == 0 {
				s.buf = s.buf[:0:0]
			}
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// ackPlan is what to send on one channel: a multiple ack up to multi
// (0: none) and single acks.
type ackPlan struct {
	ch      *amqp.Channel
	multi   uint64
	singles []uint64
}

// settleLocked marks ds settled and returns what to send. Deliveries of
// a channel that has since closed are skipped: their tags mean nothing on
// the new channel, and the server delivers them again.
func (s *sub) settleLocked(ds []*driver.Delivery) []ackPlan {
	var plans []ackPlan
	var lanes []*lane
	tags := map[*lane][]uint64{}
	for _, d := range ds {
		t, ok := d.Token.(*token)
		if !ok {
			continue
		}
		l := t.l
		if l.s != s || t.gen != l.gen || l.ch == nil || t.tag < l.low || t.tag-l.low >= uint64(len(l.settled)) || l.settled[t.tag-l.low] {
			continue
		}
		l.settled[t.tag-l.low] = true
		l.held--
		if _, seen := tags[l]; !seen {
			lanes = append(lanes, l)
		}
		tags[l] = append(tags[l], t.tag)
	}
	for _, l := range lanes {
		k := 0
		for k < len(l.settled) && l.settled[k] {
			k++
		}
		newLow := l.low + uint64(k)
		l.settled = l.settled[k:]
		l.low = newLow
		p := ackPlan{ch: l.ch}
		for _, tag := range tags[l] {
			if tag < newLow {
				p.multi = max(p.multi, tag)
			} else {
				p.singles = append(p.singles, tag)
			}
		}
		plans = append(plans, p)
	}
	return plans
}

// Ack implements driver.Acker. Contiguous runs of settled deliveries go
// out as one multiple ack.
func (s *sub) Ack(ctx context.Context, ds []*driver.Delivery) error {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	s.mu.Lock()
	plans := s.settleLocked(ds)
	s.mu.Unlock()
	var errs []error
	for _, p := range plans {
		if p.multi > 0 {
			if err := p.ch.Ack(p.multi, true); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		for _, tag := range p.singles {
			if err := p.ch.Ack(tag, false); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rabbitbus: ack %q group %q: %w (the server delivers those messages again)", s.topic, s.group, errors.Join(errs...))
	}
	return nil
}

// Retry-queue delays are rounded to the nearest power of √2 milliseconds,
// so a group has a few dozen retry queues at most.
const (
	minRetryDelay = 10 * time.Millisecond
	maxRetryDelay = 24 * time.Hour
)

func retryBucket(d time.Duration) time.Duration {
	d = min(max(d, minRetryDelay), maxRetryDelay)
	ms := float64(d) / float64(time.Millisecond)
	k := math.Round(2 * math.Log2(ms))
	return time.Duration(math.Round(math.Pow(2, k/2))) * time.Millisecond
}

func retryQueue(topic, group string, d time.Duration) string {
	return groupQueue(topic, group) + ":retry:" + strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// Nack implements driver.Nacker: each delivery is republished, with its
// next attempt number, to the group's retry queue for delay (a queue with
// that message TTL which dead-letters into the group's queue), and is
// acknowledged once the republish is confirmed. The republish is
// mandatory: one the server returns, because the retry queue is gone, is
// sent again after declaring the queue again, and fails if it is
// returned again. A delivery whose republish failed is not acknowledged;
// when some of the batch were republished and others not, the error is a
// *driver.MessageErrors saying which.
func (s *sub) Nack(ctx context.Context, ds []*driver.Delivery, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	bucket := retryBucket(delay)
	q := retryQueue(s.topic, s.group, bucket)
	declare := func(ctx context.Context) error { return s.declareRetry(ctx, q, bucket) }
	results := make([]error, len(ds)) // per delivery; errNotTried until tried
	for i := range results {
		results[i] = errNotTried
	}
	todo := make([]int, len(ds)) // indexes into ds
	for i := range todo {
		todo[i] = i
	}
	for try := 1; len(todo) > 0; try++ {
		if err := declare(ctx); err != nil {
			for _, i := range todo {
				results[i] = err
			}
			break
		}
		b := &pbatch{errs: make([]error, len(todo)), done: make(chan struct{})}
		pms := make([]*pmsg, len(todo))
		for j, i := range todo {
			d := ds[i]
			pms[j] = &pmsg{key: q, mandatory: true, pub: encode(&d.Message, true, d.Attempt+1, true), declare: declare, b: b, i: j}
		}
		if err := s.c.publisher.publish(ctx, q, pms, b, true); err != nil {
			for _, i := range todo {
				results[i] = err
			}
			break
		}
		var again []int
		for j, err := range b.errs {
			i := todo[j]
			results[i] = err
			if err != nil && try == 1 && errors.Is(err, ErrUnroutable) {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			s.c.forget("q:" + q) // the declaration cache was wrong
		}
		todo = again
	}
	var ok []*driver.Delivery
	failed := 0
	for i, err := range results {
		if err == nil {
			ok = append(ok, ds[i])
		} else {
			failed++
			results[i] = fmt.Errorf("rabbitbus: nack %q group %q: not requeued: %w", s.topic, s.group, err)
		}
	}
	// An acknowledgement that fails leaves the original with the server,
	// which delivers it again: a duplicate of the republished copy, never
	// a loss. The republish counts.
	_ = s.Ack(ctx, ok)
	switch {
	case failed == 0:
		return nil
	case failed == len(ds):
		return results[0]
	}
	return &driver.MessageErrors{Errs: results}
}

// errNotTried marks a delivery of a Nack whose republish never started.
var errNotTried = errors.New("not tried")

// declareRetry declares q, the group's retry queue for delay bucket: a
// queue with that message TTL that dead-letters into the group's queue.
//
// A quorum retry queue dead-letters at least once: it keeps a message
// until the group's queue has confirmed it, so none is lost while that
// queue is unavailable, full or even gone (the server tries again). This
// needs the reject-publish overflow; the retry queue has no length limit,
// so it never rejects a publish for it. Classic queues dead-letter at
// most once.
//
// A throwaway group's retry queue expires once unused, EphemeralExpiry
// after its TTL: publishing does not count as use, so the queue is
// declared again (which does) at least every EphemeralExpiry/2, and a
// queue always outlives the messages published into it.
func (s *sub) declareRetry(ctx context.Context, q string, bucket time.Duration) error {
	args := s.c.queueArgs()
	args["x-message-ttl"] = bucket.Milliseconds()
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = groupQueue(s.topic, s.group)
	if s.quorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	var maxAge time.Duration
	if s.expires {
		args["x-expires"] = int32((bucket + EphemeralExpiry).Milliseconds())
		maxAge = EphemeralExpiry / 2
	}
	err := s.c.ensure(ctx, "q:"+q, maxAge, func(ch *amqp.Channel) error {
		s.c.record("q", q)
		_, err := ch.QueueDeclare(q, true, false, false, false, args)
		return err
	})
	if err != nil {
		return s.c.topologyError("declare retry queue", q, err)
	}
	return nil
}

// Lag implements driver.LagReader: for every lane of the group, the
// messages ready in its queue (queue.declare-ok) plus the deliveries
// this client holds unacknowledged on it.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	counts := s.queueCounts(ctx)
	held := s.c.held()
	out := make([]driver.LaneLag, len(s.lanes))
	for i, l := range s.lanes {
		out[i] = driver.LaneLag{Lane: l.id}
		if c, ok := counts[l.queue]; ok {
			out[i].Lag = int64(c.Messages) + int64(held[l.queue])
			out[i].Known = true
		}
	}
	return out, nil
}

// queueCounts reads every lane queue's ready messages and consumers; a
// queue it could not read is missing from the result.
func (s *sub) queueCounts(ctx context.Context) map[string]amqp.Queue {
	out := map[string]amqp.Queue{}
	ac, _, err := s.link.get(ctx)
	if err != nil {
		return out
	}
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, l := range s.lanes {
		if ch == nil || ch.IsClosed() {
			if ch, err = ac.Channel(); err != nil {
				ch = nil
				return out
			}
		}
		q, err := ch.QueueDeclarePassive(l.queue, true, false, false, false, nil)
		if err == nil {
			out[l.queue] = q
		}
	}
	return out
}

// held counts the unacknowledged deliveries per queue over every
// subscriber of the connection.
func (c *conn) held() map[string]int {
	out := map[string]int{}
	for _, s := range c.subs.All() {
		s.mu.Lock()
		for _, l := range s.lanes {
			if l.ch != nil {
				out[l.queue] += l.held
			}
		}
		s.mu.Unlock()
	}
	return out
}

// rebalance runs in partitioned mode. Every interval it reads how many
// consumers each partition queue has (each member consumes every one),
// and when this member is active on more than its share, ceil(N/members),
// it hands the extra lanes over: it revokes them (the engine drains and
// acknowledges), closes their channels (the server requeues what was
// left and activates the next consumer in line) and consumes them again,
// now last in line.
func (s *sub) rebalance() {
	defer s.wg.Done()
	t := time.NewTicker(s.c.cfg.rebalance)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.c.cfg.rebalance)
		counts := s.queueCounts(ctx)
		cancel()
		members := 1
		for _, q := range counts {
			members = max(members, q.Consumers)
		}
		share := (len(s.lanes) + members - 1) / members
		s.mu.Lock()
		var active []*lane
		for _, l := range s.lanes {
			if l.claimed && !l.revoking {
				active = append(active, l)
			}
		}
		s.mu.Unlock()
		for i := len(active) - 1; i >= share && s.ctx.Err() == nil; i-- {
			s.handover(active[i])
		}
	}
}

func (s *sub) handover(l *lane) {
	s.cbMu.Lock()
	s.mu.Lock()
	if !l.claimed || l.revoking || s.closed {
		s.mu.Unlock()
		s.cbMu.Unlock()
		return
	}
	l.revoking, l.claimed = true, false
	s.dropLocked(l)
	ch := l.ch
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	s.revoke(func() { s.cb.Revoked(ctx, []string{l.id}) })
	cancel()
	s.cbMu.Unlock()
	if ch != nil {
		_ = ch.Close() // the lane's run loop consumes again
	}
}

// Close implements driver.Subscriber: it revokes the lanes it holds,
// then closes their channels, so the server requeues what is
// unacknowledged and, in partitioned mode, activates the next member.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		s.cbMu.Lock()
		s.mu.Lock()
		var ids []string
		for _, l := range s.lanes {
			if l.claimed && !l.revoking {
				l.claimed, l.revoking = false, true
				ids = append(ids, l.id)
			}
		}
		s.buf = nil // unacknowledged: the server requeues them with the channels
		s.mu.Unlock()
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			s.revoke(func() { s.cb.Revoked(ctx, ids) })
			cancel()
		}
		s.mu.Lock()
		s.closed = true
		s.buf = nil
		var chans []*amqp.Channel
		for _, l := range s.lanes {
			if l.ch != nil {
				chans = append(chans, l.ch)
			}
		}
		s.mu.Unlock()
		s.cbMu.Unlock()
		driver.Notify(s.wake)
		s.cancel()
		for _, ch := range chans {
			_ = ch.Close()
		}
		s.wg.Wait()
		s.c.subs.Remove(s)
	})
	return nil
}
