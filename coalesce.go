package omnibus

// Coalescing: Client.Publish calls to one topic with the same options
// that find coalesceInFlight driver publishes in flight wait, and are
// sent together, as one driver publish, by a sender goroutine (one per
// topic and options at most, ending when none waits). Each caller gets
// its own messages' errors back. Client.sendMu guards the queues; the
// driver is called with no lock held.
//
// A caller whose ctx ends after its call was taken returns at once while
// the sender's driver publish goes on for the others: a call that may end
// so carries copies of its messages' bodies and headers, made before it
// waits, so that the driver reads none of the caller's once it returned.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/omnibus-go/omnibus/driver"
)

// coalesceMost bounds the messages of one coalesced driver publish, and
// coalesceInFlight the driver publishes in flight for one (topic,
// options) before calls queue to be coalesced.
const (
	coalesceMost     = 1000
	coalesceInFlight = 4
)

type sendKey struct {
	topic string
	opts  driver.PublishOptions
}

// sendQueue is the publishes of a (topic, options): how many are in
// flight, and the calls waiting.
type sendQueue struct {
	calls    []*sendCall
	inflight int  // driver publishes in flight, the sender's included
	sender   bool // a sender goroutine runs
}

// sendCall is one caller's driver publish, queued.
type sendCall struct {
	ctx  context.Context
	ms   []*driver.Message
	done chan struct{}
	err  error
	gone bool // the caller's ctx ended before the call was taken
}

// send publishes ms through the driver: at once, on the caller's
// goroutine, when fewer than coalesceInFlight publishes with the same
// topic and options are in flight and none waits; otherwise it queues the
// call for the sender, which sends what waits together. A direct publish
// (a Publisher's batch) goes to the driver at once.
func (c *Client) send(ctx context.Context, topic string, ms []*driver.Message, opts driver.PublishOptions, direct bool) error {
	if direct {
		return c.conn.Publish(ctx, topic, ms, opts)
	}
	key := sendKey{topic, opts}
	c.sendMu.Lock()
	q := c.sending[key]
	if q == nil {
		q = &sendQueue{}
		c.sending[key] = q
	}
	if q.inflight < coalesceInFlight && len(q.calls) == 0 {
		q.inflight++
		c.sendMu.Unlock()
		err := c.conn.Publish(ctx, topic, ms, opts)
		c.sendMu.Lock()
		q.inflight--
		c.kickLocked(key, q)
		c.sendMu.Unlock()
		return err
	}
	if ctx.Done() != nil {
		ms = detached(ms)
	}
	call := &sendCall{ctx: ctx, ms: ms, done: make(chan struct{})}
	q.calls = append(q.calls, call)
	c.kickLocked(key, q)
	c.sendMu.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
	}
	c.sendMu.Lock()
	select {
	case <-call.done: // finished at the same moment
		c.sendMu.Unlock()
		return call.err
	default:
	}
	taken := !slices.Contains(q.calls, call)
	call.gone = true
	c.sendMu.Unlock()
	if !taken {
		return fmt.Errorf("%d message(s) not sent: %w", len(ms), ctx.Err())
	}
	return fmt.Errorf("%d message(s): %w: %w", len(ms), driver.ErrOutcomeUnknown, ctx.Err())
}

// detached returns copies of ms with bodies and headers of their own: one
// array for every body, one for the messages, a map a message with
// headers.
func detached(ms []*driver.Message) []*driver.Message {
	bodies := driver.CopyBodies(ms)
	cs := make([]driver.Message, len(ms))
	out := make([]*driver.Message, len(ms))
	for i, m := range ms {
		cs[i] = *m
		cs[i].Body = bodies[i]
		cs[i].Headers = maps.Clone(m.Headers)
		out[i] = &cs[i]
	}
	return out
}

// kickLocked starts the sender when calls wait and there is room in
// flight, and forgets a queue with nothing in flight or waiting.
func (c *Client) kickLocked(key sendKey, q *sendQueue) {
	switch {
	case len(q.calls) > 0 && !q.sender && q.inflight < coalesceInFlight:
		q.sender = true
		q.inflight++
		go c.sender(key, q)
	case len(q.calls) == 0 && q.inflight == 0 && c.sending[key] == q:
		delete(c.sending, key)
	}
}

// sender sends q's waiting calls, as many together as coalesceMost
// allows, until none waits.
func (c *Client) sender(key sendKey, q *sendQueue) {
	for {
		c.sendMu.Lock()
		var calls []*sendCall
		n := 0
		for len(q.calls) > 0 && (n == 0 || n+len(q.calls[0].ms) <= coalesceMost) {
			call := q.calls[0]
			q.calls = q.calls[1:]
			if call.gone {
				continue
			}
			calls = append(calls, call)
			n += len(call.ms)
		}
		if len(calls) == 0 {
			q.sender = false
			q.inflight--
			q.calls = nil
			c.kickLocked(key, q)
			c.sendMu.Unlock()
			return
		}
		c.sendMu.Unlock()
		c.sendTogether(key, calls, n)
	}
}

// sendTogether publishes the calls' messages in one driver call, under a
// context that ends when every caller's has, and gives each call its
// messages' outcome.
func (c *Client) sendTogether(key sendKey, calls []*sendCall, n int) {
	ctx := calls[0].ctx
	if len(calls) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		var left atomic.Int32
		left.Store(int32(len(calls)))
		for _, call := range calls {
			stop := context.AfterFunc(call.ctx, func() {
				if left.Add(-1) == 0 {
					cancel()
				}
			})
			defer stop()
		}
	}
	ms := make([]*driver.Message, 0, n)
	for _, call := range calls {
		ms = append(ms, call.ms...)
	}
	err := c.conn.Publish(ctx, key.topic, ms, key.opts)
	var me *driver.MessageErrors
	perMessage := errors.As(err, &me) && len(me.Errs) == len(ms)
	at := 0
	for _, call := range calls {
		switch {
		case err == nil:
		case perMessage:
			errs := me.Errs[at : at+len(call.ms)]
			for _, e := range errs {
				if e != nil {
					call.err = &driver.MessageErrors{Errs: errs}
					break
				}
			}
		default:
			call.err = err
		}
		at += len(call.ms)
	}
	c.sendMu.Lock()
	for _, call := range calls {
		close(call.done)
	}
	c.sendMu.Unlock()
}
