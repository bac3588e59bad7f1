package rabbitbus

// Consuming: one goroutine per lane (lane.run) declares the lane's
// queue, opens a channel on the subscribers' connection, moves its
// deliveries into the member's buffer and opens it again after a drop;
// Receive hands the buffer to the engine's fetch loop. sub.mu guards the buffer and the
// lanes' channel state.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
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
func (l *lane) run() { l.s.consumeUntilClosed(l.queue, "consuming", l.open, l.serve) }

// consumeUntilClosed opens a consumer of queue with open and serves it
// with serve, again after the channel drops (after a backoff when opening
// fails), until Close: the loop of a goroutine the sub owns (a lane's, or
// the tail of the run records). what names the work in the log.
func (s *sub) consumeUntilClosed(queue, what string, open func(*amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error),
	serve func(*amqp.Channel, <-chan amqp.Delivery)) {
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
		ch, dels, err := open(ac)
		if err != nil {
			if s.ctx.Err() == nil && attempt%10 == 1 {
				s.c.log.Warn(what+" failed, retrying", "queue", queue, "err", err)
			}
			continue
		}
		attempt = 0
		serve(ch, dels)
		if s.ctx.Err() != nil {
			return
		}
	}
}

func (l *lane) open(ac *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	return openConsumer(ac, l.queue, l.s.prefetch, nil, l.declare)
}

// openConsumer opens a channel on ac, declares what it reads with
// declare, and consumes queue with manual acknowledgements, prefetch and
// args; the channel is closed when a step fails.
func openConsumer(ac *amqp.Connection, queue string, prefetch int, args amqp.Table, declare func(*amqp.Channel) error) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := ac.Channel()
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*amqp.Channel, <-chan amqp.Delivery, error) {
		_ = ch.Close()
		return nil, nil, err
	}
	if err := declare(ch); err != nil {
		return fail(err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fail(err)
	}
	dels, err := ch.Consume(queue, "", false, false, false, false, args)
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
	l.held, l.low, l.settled, l.times = 0, 1, l.settled[:0], l.times[:0]
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
	// The delivery and its token in one allocation.
	p := &struct {
		d driver.Delivery
		t token
	}{t: token{l: l, gen: gen, tag: d.DeliveryTag}}
	dl := &p.d
	*dl = driver.Delivery{
		Message:  msg,
		Lane:     l.id,
		Position: strconv.FormatUint(d.DeliveryTag, 10),
		Attempt:  attempt,
		// A retry is a new message (see Nack): redelivered means a
		// channel that held it closed without settling it.
		Redelivered: d.Redelivered,
		Token:       &p.t,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.gen != gen {
		return
	}
	l.held++
	for uint64(len(l.settled)) < d.DeliveryTag-l.low+1 {
		l.settled = append(l.settled, false)
		l.times = append(l.times, time.Time{})
	}
	l.times[d.DeliveryTag-l.low] = msg.Time
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
			out := driver.Shift(&s.buf, n)
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
