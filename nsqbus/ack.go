package nsqbus

// Settling: FIN for a handled message, REQ with a delay for a retry
// (nsqd delivers it again after the delay, to any member), and the
// keeper, which sends TOUCH for what the member holds so that nsqd does
// not deliver it again while a handler is slow. Ack and Nack run on the
// engine's goroutines, the keeper on its own; sub.mu guards the held
// set, and no go-nsq call is made under it.

import (
	"context"
	"time"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus/driver"
)

// forget removes the deliveries from the held set and returns their
// messages.
func (s *sub) forget(ds []*driver.Delivery) []*nsq.Message {
	ms := make([]*nsq.Message, len(ds))
	s.mu.Lock()
	for i, d := range ds {
		ms[i] = d.Token.(*nsq.Message)
		delete(s.held, ms[i])
	}
	s.mu.Unlock()
	return ms
}

// Ack implements driver.Acker: FIN. A message answered already (handed
// back by Close) is not answered again; one whose connection closed is
// dropped by go-nsq, and nsqd delivers it again after msg_timeout.
func (s *sub) Ack(ctx context.Context, ds []*driver.Delivery) error {
	for _, m := range s.forget(ds) {
		m.Finish()
	}
	return nil
}

// Nack implements driver.Nacker: REQ with delay, at most nsqd's
// --max-req-timeout (a longer one would make nsqd close the connection).
// nsqd counts the next delivery as one more attempt.
func (s *sub) Nack(ctx context.Context, ds []*driver.Delivery, delay time.Duration) error {
	delay = min(max(delay, 0), s.c.limits.maxReq)
	for _, m := range s.forget(ds) {
		m.RequeueWithoutBackoff(delay)
	}
	return nil
}

// touchAfter is how long a message is held before the keeper touches
// it, and touchTick how often the keeper looks: a touch reaches nsqd at
// most half of msg_timeout after the message arrived or was last
// touched, leaving the other half for a slow scheduler and the network.
func (s *sub) touchAfter() time.Duration { return s.c.cfg.msgTO / 4 }
func (s *sub) touchTick() time.Duration  { return s.c.cfg.msgTO / 6 }

// keep sends TOUCH for every message held longer than touchAfter since
// it was received or last touched, until Close. nsqd extends a touched
// message's timeout by msg_timeout, up to --max-msg-timeout (15 minutes
// by default) after its delivery; a handler slower than that sees its
// message delivered again.
func (s *sub) keep() {
	defer s.wg.Done()
	after := s.touchAfter()
	t := time.NewTicker(s.touchTick())
	defer t.Stop()
	var due []*nsq.Message
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			due = due[:0]
			s.mu.Lock()
			for m, at := range s.held {
				if now.Sub(at) >= after {
					s.held[m] = now
					due = append(due, m)
				}
			}
			s.mu.Unlock()
			for _, m := range due {
				m.Touch()
			}
		}
	}
}
