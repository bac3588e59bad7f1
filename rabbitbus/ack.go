package rabbitbus

// Acknowledgements: Ack marks deliveries settled per lane and sends each
// contiguous run as one multiple ack. It runs on the engine's settle
// loop (and in Nack, on a worker); ackMu serializes plans and sends, so
// that a multiple ack never overtakes a single ack of a tag it covers,
// and sub.mu guards the lanes' settled tags.

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

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
		l.settled, l.times = l.settled[k:], l.times[k:]
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
// out as one multiple ack. Ack returns once the server has processed
// them: a basic.qos (the channel's prefetch, unchanged) follows them on
// each channel, and the server answers it after the acks before it. So
// what Ack returned for is not delivered again when the process dies the
// moment after (the engine runs a suspect only then); an ack still in
// the connection's buffer dies with it.
func (s *sub) Ack(ctx context.Context, ds []*driver.Delivery) error {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	s.mu.Lock()
	var runs []string // of counted deliveries: their counts go once acknowledged
	if s.runs != nil {
		for _, d := range ds {
			if t, ok := d.Token.(*token); ok && t.run != "" {
				runs = append(runs, t.run)
			}
		}
	}
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
		if err := p.ch.Qos(s.prefetch, 0, false); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rabbitbus: ack %q group %q: %w (the server delivers those messages again)", s.topic, s.group, errors.Join(errs...))
	}
	if len(runs) > 0 {
		if err := s.runs.done(ctx, runs); err != nil {
			// The messages are settled: a count left behind only takes room.
			s.c.log.Warn("forgetting run counts failed", "topic", s.topic, "group", s.group, "err", err)
		}
	}
	return nil
}
