package rabbitbus

// Publishing: the publisher (one confirm-mode channel on the publishing
// connection), Publish, and the sends: in order, waiting for a channel,
// and while the server blocks the connection. A send runs on the
// caller's goroutine, or on await's when its context can end; the
// confirms are in confirm.go. Lock order: sendMu before pendMu (see
// publisher).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// ErrUnroutable is wrapped by the error of a message the server returned
// because no queue was bound to take it (URL parameter mandatory=true).
var ErrUnroutable = errors.New("unroutable: no queue is bound to take the message")

// ErrNacked is wrapped by the error of a message the server refused to
// take responsibility for (a publisher confirm nack).
var ErrNacked = errors.New("the server nacked the message")

// window is the most messages a publisher has unconfirmed, and the room
// of the channels amqp091 hands their confirms and returns over. amqp091
// drops a confirm or a return it cannot hand over within 5 seconds (the
// channel full): a confirm loop starved of processor time that long
// would report a returned message routed (a retry whose queue is gone
// would be lost) or leave a message waiting for its confirm for ever.
// Each unconfirmed message has at most one confirm and one return queued,
// so with no more unconfirmed than the room, none waits.
const window = 1024

// starve, when set (by tests), runs in the confirm loop before it takes
// each confirm or return: a loop starved of processor time.
var starve atomic.Pointer[func()]

// publisher owns the confirm-mode channel of the publishing connection.
//
// Goroutines: run (owned by the publisher, ended by stop) opens the
// channel, runs the confirm loop, and fails what a dead channel left
// unconfirmed. A Publish whose ctx can end writes copies of its bodies
// on a goroutine of conn.await, so that it returns at its deadline while
// a write is stuck on a connection the server blocks, and leaves the
// caller its messages; the others write on the caller's goroutine.
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
	places  chan struct{} // one element per unconfirmed message, window at most

	pendMu  sync.Mutex
	pending map[uint64]*pmsg  // by delivery tag on ch
	routes  map[string]*route // mandatory messages pending, by routeKey
	maxBody int               // the server's limit, once it told us (0: not yet)

	closed atomic.Bool
	halt   chan struct{} // closed by stop
	done   chan struct{}
}

// pmsg is one message waiting for its confirm.
type pmsg struct {
	exchange  string
	key       string
	mandatory bool
	pub       amqp.Publishing
	b         *pbatch
	i         int
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
		places:  make(chan struct{}, window),
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
	// A Publish whose ctx can end writes on a goroutine of conn.await and
	// returns when ctx ends, even halfway through a body stuck on the
	// socket (the server stopped reading); the rest of that body goes out
	// once the socket drains. The bodies are copied, one array for the
	// batch, so that what goes out then is the message as published, not
	// what the caller has put in its place since.
	var bodies [][]byte
	if ctx.Done() != nil {
		bodies = driver.CopyBodies(msgs)
	}
	failed := false
	for i, m := range msgs {
		if len(m.Body) > max {
			b.errs[i] = fmt.Errorf("rabbitbus: publish %q: message %q body is %d bytes, limit %d: %w", topic, m.ID, len(m.Body), max, driver.ErrTooLarge)
			failed = true
			continue
		}
		if err := checkHeaders(m); err != nil {
			b.errs[i] = fmt.Errorf("rabbitbus: publish %q: message %q: %w: %w", topic, m.ID, err, driver.ErrInvalid)
			failed = true
			continue
		}
		pm := &pmsg{
			exchange:  topic,
			key:       routingKey(m),
			mandatory: confirm && c.cfg.mandatory,
			pub:       encode(m, confirm, 0, false),
			b:         b,
			i:         i,
		}
		if bodies != nil {
			pm.pub.Body = bodies[i]
		}
		pms = append(pms, pm)
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
// blocks it. When the channel dies under a send, the message and those
// after it fail with driver.ErrRetryable: a write cut off by a dead
// socket did not put the whole message on the wire (amqp091 shuts the
// connection after it, and the server drops a message cut short), and
// the others were not written. send returns when ctx ends even while a
// write is stuck (see conn.await); the messages not yet written are then
// not sent.
func (p *publisher) send(ctx context.Context, pms []*pmsg, confirm bool) error {
	return p.c.await(ctx, func() error { return p.write(ctx, pms, confirm) })
}

func (p *publisher) write(ctx context.Context, pms []*pmsg, confirm bool) error {
	fail := func(m *pmsg, err error) {
		if confirm {
			m.b.finish(m.i, err)
		} else {
			m.b.errs[m.i] = err
		}
	}
	held := false // a place in the window, taken for pms[i]
	defer func() {
		if held {
			<-p.places
		}
	}()
	i := 0
	for i < len(pms) {
		var err error
		if confirm && !held {
			err = p.place(ctx)
			held = err == nil
		}
		if err == nil {
			err = p.writable(ctx)
		}
		if err != nil {
			if i > 0 {
				return fmt.Errorf("%w (after sending %d of %d messages)", err, i, len(pms))
			}
			return err
		}
		ch := p.ch
		for ; i < len(pms) && ctx.Err() == nil && !p.isBlocked(); i++ {
			m := pms[i]
			if confirm && !held {
				select {
				case p.places <- struct{}{}:
					held = true
				default:
				}
				if !held {
					break // the window is full: wait for a place without sendMu
				}
			}
			tag := p.nextTag
			if confirm {
				p.pendMu.Lock()
				p.addLocked(tag, m) // the pending message holds the place now
				p.pendMu.Unlock()
				held = false
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
			}
			if !ch.IsClosed() && !connectionLost(err) { // the message itself is bad
				fail(m, err)
				continue
			}
			if p.ch == ch {
				p.ch = nil
				p.up = make(chan struct{})
			}
			for j, m := range pms[i:] {
				what := "not sent"
				if j == 0 {
					what = "cut off"
				}
				fail(m, fmt.Errorf("message %q %s: the channel closed (%w): %w", m.pub.MessageId, what, err, driver.ErrRetryable))
			}
			i = len(pms)
		}
		<-p.sendMu
	}
	return nil
}

// place takes a place in the window, waiting while it is full. It gives
// up when ctx ends or the publisher stops.
func (p *publisher) place(ctx context.Context) error {
	select {
	case p.places <- struct{}{}:
		return nil
	case <-p.halt:
		return driver.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
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
