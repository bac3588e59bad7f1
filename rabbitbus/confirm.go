package rabbitbus

// Confirms: the publisher's goroutine (run) opens the confirm-mode
// channel, matches confirms and returns to the messages pending (a
// return comes before its message's confirm and carries no delivery tag:
// routes count them), and fails what a dead channel left unconfirmed
// with driver.ErrOutcomeUnknown, which omnibus.Publish sends again.
// pendMu guards the pending messages and the routes; sendMu is taken to
// change the channel.

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// route counts, for the mandatory messages pending with one exchange,
// routing key and message ID, the returns the server sent. A return
// comes before the confirm of its message and carries no delivery tag,
// so a confirm counts as returned when a return with its route came
// while it was pending: a message is never confirmed as routed when it
// was not, and at worst one that was routed is reported unroutable along
// with a returned copy of the same ID sent at the same time.
type route struct {
	pending int
	returns int
}

func routeKey(exchange, key, id string) string { return exchange + "\x00" + key + "\x00" + id }

// addLocked records m as sent with delivery tag tag; it holds a place in
// the window, which removeLocked or dropLocked gives back.
func (p *publisher) addLocked(tag uint64, m *pmsg) {
	p.pending[tag] = m
	if m.mandatory {
		k := routeKey(m.exchange, m.key, m.pub.MessageId)
		r := p.routes[k]
		if r == nil {
			r = &route{}
			p.routes[k] = r
		}
		r.pending++
		m.returns = r.returns
	}
}

// removeLocked forgets the message sent with tag and reports whether the
// server returned it.
func (p *publisher) removeLocked(tag uint64) (m *pmsg, returned bool) {
	m = p.pending[tag]
	if m == nil {
		return nil, false
	}
	delete(p.pending, tag)
	<-p.places
	if !m.mandatory {
		return m, false
	}
	k := routeKey(m.exchange, m.key, m.pub.MessageId)
	r := p.routes[k]
	if r == nil {
		return m, false
	}
	returned = r.returns > m.returns
	if r.pending--; r.pending == 0 {
		delete(p.routes, k)
	}
	return m, returned
}

// dropLocked forgets every pending message and route.
func (p *publisher) dropLocked() {
	for range p.pending {
		<-p.places
	}
	p.pending = map[uint64]*pmsg{}
	clear(p.routes)
}

func (p *publisher) run() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-p.halt
		cancel()
	}()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(backoff(attempt))
			select {
			case <-p.halt:
				t.Stop()
				p.failAll(driver.ErrClosed)
				return
			case <-t.C:
			}
		}
		ac, _, err := p.c.pub.get(ctx)
		if err != nil {
			p.failAll(driver.ErrClosed)
			return
		}
		ch, err := ac.Channel()
		if err != nil {
			continue
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			continue
		}
		attempt = 0
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
		returns := ch.NotifyReturn(make(chan amqp.Return, window))
		closes := ch.NotifyClose(make(chan *amqp.Error, 1))
		served := make(chan struct{})
		go func() {
			defer close(served)
			p.serve(confirms, returns)
		}()
		p.open(ch)
		select {
		case <-served:
		case <-p.halt:
			_ = ch.Close()
			<-served
			p.failAll(driver.ErrClosed)
			return
		}
		var reason *amqp.Error
		select {
		case reason = <-closes:
		default:
		}
		p.down(ch, reason)
	}
}

// open makes ch the channel publishers send on.
func (p *publisher) open(ch *amqp.Channel) {
	p.sendMu <- struct{}{}
	defer func() { <-p.sendMu }()
	p.pendMu.Lock()
	p.dropLocked()
	p.pendMu.Unlock()
	p.nextTag = 1
	p.ch = ch
	close(p.up)
}

// serve handles confirms and returns until the channel closes.
func (p *publisher) serve(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	for {
		if f := starve.Load(); f != nil {
			(*f)()
		}
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.noteReturn(r)
		case c, ok := <-confirms:
			if !ok {
				return
			}
			// A return precedes its message's confirm on the wire; the
			// client queued it before this confirm, so take it first.
			for drained := false; !drained && returns != nil; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
					} else {
						p.noteReturn(r)
					}
				default:
					drained = true
				}
			}
			p.confirmed(c)
		}
	}
}

func (p *publisher) noteReturn(r amqp.Return) {
	p.pendMu.Lock()
	if rt := p.routes[routeKey(r.Exchange, r.RoutingKey, r.MessageId)]; rt != nil {
		rt.returns++
	}
	p.pendMu.Unlock()
}

func (p *publisher) confirmed(c amqp.Confirmation) {
	p.pendMu.Lock()
	m, returned := p.removeLocked(c.DeliveryTag)
	p.pendMu.Unlock()
	if m == nil {
		return
	}
	var err error
	if returned {
		err = fmt.Errorf("message %q to exchange %q with routing key %q: %w: %w", m.pub.MessageId, m.exchange, m.key, ErrUnroutable, driver.ErrNotFound)
	}
	if err == nil && !c.Ack {
		err = fmt.Errorf("message %q: %w", m.pub.MessageId, ErrNacked)
	}
	m.b.finish(m.i, err)
}

var tooLarge = regexp.MustCompile(`message size (\d+) is larger than (?:configured )?max size (\d+)`)

// down fails what the dead channel ch left unconfirmed: a message over
// the server's size limit (it closed the channel for it) with
// ErrTooLarge, the others with ErrOutcomeUnknown (the server may have
// stored them), for omnibus.Publish to send again.
func (p *publisher) down(ch *amqp.Channel, reason *amqp.Error) {
	p.sendMu <- struct{}{}
	if p.ch == ch {
		p.ch = nil
		p.up = make(chan struct{})
	}
	<-p.sendMu

	p.pendMu.Lock()
	tags := make([]uint64, 0, len(p.pending))
	for t := range p.pending {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	failed := make([]*pmsg, 0, len(tags))
	errs := make([]error, 0, len(tags))
	if reason != nil {
		if sm := tooLarge.FindStringSubmatch(reason.Reason); sm != nil {
			if n, err := strconv.Atoi(sm[2]); err == nil {
				p.maxBody = n
			}
		}
	}
	for _, t := range tags {
		m := p.pending[t]
		switch {
		case p.maxBody > 0 && len(m.pub.Body) > p.maxBody:
			failed = append(failed, m)
			errs = append(errs, fmt.Errorf("message %q body is %d bytes, the server's limit is %d: %w: %w", m.pub.MessageId, len(m.pub.Body), p.maxBody, driver.ErrTooLarge, reason))
		default:
			failed = append(failed, m)
			errs = append(errs, fmt.Errorf("message %q: the channel closed before the server confirmed it (%w): %w", m.pub.MessageId, reasonErr(reason), driver.ErrOutcomeUnknown))
		}
	}
	p.dropLocked()
	p.pendMu.Unlock()
	for i, m := range failed {
		m.b.finish(m.i, errs[i])
	}
	if reason != nil && reason.Code == amqp.NotFound {
		p.c.forget("")
	}
	if reason != nil && !p.closed.Load() {
		p.c.log.Warn("publishing channel closed; its unconfirmed messages fail as of unknown outcome", "reason", reason, "unconfirmed", len(failed))
	}
}

func reasonErr(r *amqp.Error) error {
	if r == nil {
		return amqp.ErrClosed
	}
	return r
}

// failAll fails every unconfirmed message.
func (p *publisher) failAll(err error) {
	p.pendMu.Lock()
	var ms []*pmsg
	for _, m := range p.pending {
		ms = append(ms, m)
	}
	p.dropLocked()
	p.pendMu.Unlock()
	for _, m := range ms {
		m.b.finish(m.i, err)
	}
}
