package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// maxSends bounds how often one message is sent on channels that then
// died before confirming it.
const maxSends = 10

// ErrUnroutable is wrapped by the error of a message the server returned
// because no queue was bound to take it (URL parameter mandatory=true).
var ErrUnroutable = errors.New("unroutable: no queue is bound to take the message")

// ErrNacked is wrapped by the error of a message the server refused to
// take responsibility for (a publisher confirm nack).
var ErrNacked = errors.New("the server nacked the message")

// publisher owns the confirm-mode channel of the publishing connection.
//
// Goroutines: run (owned by the publisher, ended by stop) opens the
// channel, re-sends what a dead channel left unconfirmed, and runs the
// confirm loop. A Publish whose ctx can end writes on a goroutine of
// conn.await, so that it returns at its deadline while a write is stuck
// on a connection the server blocks; the others write on the caller's
// goroutine.
//
// Lock order: sendMu before pendMu. sendMu (a channel, so that waiting
// for it honours ctx) serializes sends: a delivery tag is the channel's
// publish count, so sends and tag bookkeeping must be atomic. pendMu
// guards the unconfirmed messages and is all the confirm loop takes, so
// a send blocked on the socket never holds up confirms.
type publisher struct {
	c *conn

	sendMu  chan struct{} // held by sending into it
	ch      *amqp.Channel // nil while there is none
	up      chan struct{} // closed while ch is set
	nextTag uint64

	pendMu  sync.Mutex
	pending map[uint64]*pmsg  // by delivery tag on ch
	routes  map[string]*route // mandatory messages pending, by routeKey
	backlog []*pmsg           // unconfirmed on a dead channel: sent first on the next
	maxBody int               // the server's limit, once it told us (0: not yet)

	closed atomic.Bool
	halt   chan struct{} // closed by stop
	done   chan struct{}
}

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

// pmsg is one message waiting for its confirm.
type pmsg struct {
	exchange  string
	key       string
	mandatory bool
	pub       amqp.Publishing
	declare   func(context.Context) error // makes sure the target exists
	b         *pbatch
	i         int
	sends     int
	returns   int // the route's returns when it was sent
}

// pbatch collects the outcomes of one Publish call.
type pbatch struct {
	errs []error
	left atomic.Int64
	done chan struct{}
}

func (b *pbatch) finish(i int, err error) {
	b.errs[i] = err
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

func newPublisher(c *conn) *publisher {
	p := &publisher{
		c:       c,
		sendMu:  make(chan struct{}, 1),
		up:      make(chan struct{}),
		pending: map[uint64]*pmsg{},
		routes:  map[string]*route{},
		halt:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go p.run()
	return p
}

func (p *publisher) limit() int {
	p.pendMu.Lock()
	defer p.pendMu.Unlock()
	if p.maxBody > 0 && p.maxBody < p.c.cfg.maxBytes {
		return p.maxBody
	}
	return p.c.cfg.maxBytes
}

// Publish implements driver.Conn.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rabbitbus: publish %q: %w", topic, err)
	}
	if opts.DeadLetter {
		c.mu.Lock()
		c.dead[topic] = true
		c.mu.Unlock()
	}
	if err := c.ensureTopic(ctx, topic); err != nil {
		return err
	}
	confirm := opts.Durability != driver.DurabilityNone
	p := c.publisher
	max := p.limit()
	b := &pbatch{errs: make([]error, len(msgs)), done: make(chan struct{})}
	pms := make([]*pmsg, 0, len(msgs))
	failed := false
	for i, m := range msgs {
		if len(m.Body) > max {
			b.errs[i] = fmt.Errorf("rabbitbus: publish %q: message %q body is %d bytes, limit %d: %w", topic, m.ID, len(m.Body), max, driver.ErrTooLarge)
			failed = true
			continue
		}
		pms = append(pms, &pmsg{
			exchange:  topic,
			key:       routingKey(m),
			mandatory: confirm && c.cfg.mandatory,
			pub:       encode(m, confirm, 0, false),
			b:         b,
			i:         i,
		})
	}
	if err := p.publish(ctx, topic, pms, b, confirm); err != nil {
		return err
	}
	if failed || slices.ContainsFunc(b.errs, func(e error) bool { return e != nil }) {
		return &driver.MessageErrors{Errs: b.errs}
	}
	return nil
}

// publish sends pms and, with confirm, waits for their confirms.
func (p *publisher) publish(ctx context.Context, topic string, pms []*pmsg, b *pbatch, confirm bool) error {
	if len(pms) == 0 {
		return nil
	}
	if confirm {
		b.left.Store(int64(len(pms)))
	}
	if err := p.send(ctx, pms, confirm); err != nil {
		if _, reason := p.c.pub.blocked(); reason != "" && ctx.Err() != nil {
			return fmt.Errorf("rabbitbus: publish %q: %w (the server blocks publishing: %s)", topic, err, reason)
		}
		return fmt.Errorf("rabbitbus: publish %q: %w", topic, err)
	}
	if !confirm {
		return nil
	}
	select {
	case <-b.done:
		for i, err := range b.errs {
			if err != nil && !errors.Is(err, driver.ErrTooLarge) {
				b.errs[i] = fmt.Errorf("rabbitbus: publish %q: %w", topic, err)
			}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitbus: publish %q: waiting for confirms: %w", topic, ctx.Err())
	}
}

// send puts pms on the channel in order, waiting for a channel while
// there is none and for the server to unblock the connection while it
// blocks it. A message whose send fails because the channel died is sent
// again on the next one. send returns when ctx ends even while a write is
// stuck (see conn.await); the messages not yet written are then not sent.
func (p *publisher) send(ctx context.Context, pms []*pmsg, confirm bool) error {
	return p.c.await(ctx, func() error { return p.write(ctx, pms, confirm) })
}

func (p *publisher) write(ctx context.Context, pms []*pmsg, confirm bool) error {
	i := 0
	for i < len(pms) {
		if err := p.writable(ctx); err != nil {
			if i > 0 {
				return fmt.Errorf("%w (after sending %d of %d messages)", err, i, len(pms))
			}
			return err
		}
		ch := p.ch
		for ; i < len(pms) && ctx.Err() == nil && !p.isBlocked(); i++ {
			m := pms[i]
			tag := p.nextTag
			if confirm {
				m.sends++
				p.pendMu.Lock()
				p.addLocked(tag, m)
				p.pendMu.Unlock()
			}
			err := ch.Publish(m.exchange, m.key, m.mandatory, false, m.pub)
			if err == nil {
				p.nextTag++
				continue
			}
			if confirm {
				p.pendMu.Lock()
				p.removeLocked(tag)
				p.pendMu.Unlock()
				m.sends--
			}
			if !ch.IsClosed() { // the message itself is bad
				if confirm {
					m.b.finish(m.i, err)
				} else {
					m.b.errs[m.i] = err
				}
				continue
			}
			if p.ch == ch {
				p.ch = nil
				p.up = make(chan struct{})
			}
			break
		}
		<-p.sendMu
	}
	return nil
}

// writable takes sendMu once there is a channel and the server does not
// block the connection. It gives up when ctx ends or the publisher stops.
func (p *publisher) writable(ctx context.Context) error {
	for {
		select {
		case p.sendMu <- struct{}{}:
		case <-p.halt:
			return driver.ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
		var wait <-chan struct{} = p.up
		if p.ch != nil {
			if wait, _ = p.c.pub.blocked(); wait == nil {
				return nil
			}
		}
		<-p.sendMu
		select {
		case <-wait:
		case <-p.halt:
			return driver.ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *publisher) isBlocked() bool {
	unblocked, _ := p.c.pub.blocked()
	return unblocked != nil
}

// addLocked records m as sent with delivery tag tag.
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
	delete(p.pending, tag)
	if m == nil || !m.mandatory {
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
		if err := p.redeclare(ctx); err != nil {
			continue
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
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
		returns := ch.NotifyReturn(make(chan amqp.Return, 64))
		closes := ch.NotifyClose(make(chan *amqp.Error, 1))
		served := make(chan struct{})
		go func() {
			defer close(served)
			p.serve(confirms, returns)
		}()
		p.resend(ch)
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

// redeclare makes sure the targets of the backlog exist (after a broker
// restart, or after the server said one was gone).
func (p *publisher) redeclare(ctx context.Context) error {
	p.pendMu.Lock()
	backlog := slices.Clone(p.backlog)
	p.pendMu.Unlock()
	seen := map[string]bool{}
	for _, m := range backlog {
		k := m.exchange + "\x00" + m.key
		if seen[k] {
			continue
		}
		seen[k] = true
		var err error
		if m.declare != nil {
			err = m.declare(ctx)
		} else if m.exchange != "" {
			err = p.c.ensureTopic(ctx, m.exchange)
		}
		if err != nil {
			p.c.log.Warn("redeclaring before re-publishing failed", "exchange", m.exchange, "err", err)
			return err
		}
	}
	return nil
}

// resend sends the backlog on the new channel ch, then opens ch to
// publishers.
func (p *publisher) resend(ch *amqp.Channel) {
	p.sendMu <- struct{}{}
	defer func() { <-p.sendMu }()
	p.pendMu.Lock()
	backlog := p.backlog
	p.backlog = nil
	p.pending = map[uint64]*pmsg{}
	clear(p.routes)
	p.pendMu.Unlock()
	p.nextTag = 1
	for n, m := range backlog {
		tag := p.nextTag
		m.sends++
		p.pendMu.Lock()
		p.addLocked(tag, m)
		p.pendMu.Unlock()
		if err := ch.Publish(m.exchange, m.key, m.mandatory, false, m.pub); err != nil {
			p.pendMu.Lock()
			p.removeLocked(tag)
			m.sends--
			p.backlog = append(backlog[n:], p.backlog...)
			p.pendMu.Unlock()
			return // the channel died again; run notices
		}
		p.nextTag++
	}
	p.ch = ch
	close(p.up)
}

// serve handles confirms and returns until the channel closes.
func (p *publisher) serve(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	for {
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

// down moves what the dead channel ch left unconfirmed to the backlog.
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
	var failed []*pmsg
	var errs []error
	backlog := make([]*pmsg, 0, len(tags)+len(p.backlog))
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
		case m.sends >= maxSends:
			failed = append(failed, m)
			errs = append(errs, fmt.Errorf("message %q: sent %d times on channels that closed before confirming it, last: %w", m.pub.MessageId, m.sends, reasonErr(reason)))
		default:
			backlog = append(backlog, m)
		}
	}
	p.backlog = append(backlog, p.backlog...)
	p.pending = map[uint64]*pmsg{}
	clear(p.routes)
	p.pendMu.Unlock()
	for i, m := range failed {
		m.b.finish(m.i, errs[i])
	}
	if reason != nil && reason.Code == amqp.NotFound {
		p.c.forget("")
	}
	if reason != nil && !p.closed.Load() {
		p.c.log.Warn("publishing channel closed; re-publishing unconfirmed messages", "reason", reason, "unconfirmed", len(p.backlog))
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
	ms = append(ms, p.backlog...)
	p.pending = map[uint64]*pmsg{}
	clear(p.routes)
	p.backlog = nil
	p.pendMu.Unlock()
	for _, m := range ms {
		m.b.finish(m.i, err)
	}
}

// stop fails what is unconfirmed with ErrClosed and makes every send
// return; a send stuck on the socket returns once the connection closes,
// so the caller closes it before it waits.
func (p *publisher) stop() {
	if !p.closed.Swap(true) {
		close(p.halt)
	}
}

// wait waits for the publisher's goroutine, after stop.
func (p *publisher) wait() { <-p.done }
