package nsqbus

// Publishing: one go-nsq Producer per nsqd, made on first use; Publish
// encodes the batch, refuses what is over nsqd's message size, sends
// the rest as MPUB commands within nsqd's body size, and maps nsqd's
// refusals. go-nsq pipelines the commands of concurrent Publish calls on
// each producer's connection. publisher.mu guards the producers.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus/driver"
)

type publisher struct {
	c    *conn
	next atomic.Uint32 // round robin over the nsqds

	mu        sync.Mutex
	producers map[string]*producer // by nsqd TCP address
	closed    bool
}

func newPublisher(c *conn) *publisher {
	return &publisher{c: c, producers: map[string]*producer{}}
}

// producer returns the producer of the nsqd at addr.
func (p *publisher) producer(addr string) (*producer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, driver.ErrClosed
	}
	if pr := p.producers[addr]; pr != nil {
		return pr, nil
	}
	pr := newProducer(p.c, addr)
	p.producers[addr] = pr
	return pr, nil
}

// ping connects to the nsqd at addr (IDENTIFY, and AUTH with the
// secret), bounded by ctx.
func (p *publisher) ping(ctx context.Context, addr string) error {
	pr, err := p.producer(addr)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { // ends within dial_timeout and nsqd's answers
		pr.mu.Lock()
		defer pr.mu.Unlock()
		if pr.nc != nil {
			done <- nil
			return
		}
		done <- pr.connectLocked()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("nsqd %s: %w", addr, p.c.clientError(err))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nsqd %s: %w", addr, ctx.Err())
	}
}

func (p *publisher) close() {
	p.mu.Lock()
	p.closed = true
	prs := p.producers
	p.producers = nil
	p.mu.Unlock()
	for _, pr := range prs {
		pr.close()
	}
}

// Publish implements driver.Conn.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	name, err := topicName(topic)
	if err != nil {
		return fmt.Errorf("nsqbus: publish: %w", err)
	}
	// Encode the batch into one buffer; refuse what nsqd would.
	size := 0
	for _, m := range msgs {
		size += len(m.Body)*4/3 + m.Size() + envelopeRoom
	}
	buf := make([]byte, 0, size)
	bodies := make([][]byte, len(msgs))
	errs := make([]error, len(msgs))
	var send []int // indexes of the messages to send
	for i, m := range msgs {
		start := len(buf)
		buf = encode(buf, m)
		bodies[i] = buf[start:len(buf):len(buf)]
		if n := len(bodies[i]); n > c.limits.maxMsg {
			errs[i] = fmt.Errorf("nsqbus: publish %q: message %q is %d bytes as a CloudEvent, nsqd's max-msg-size is %d: %w",
				topic, m.ID, n, c.limits.maxMsg, driver.ErrTooLarge)
			continue
		}
		send = append(send, i)
	}
	// MPUB commands within nsqd's body size: 4 bytes of count, and 4 of
	// size before each message.
	var batches [][]int
	for len(send) > 0 {
		n, total := 0, 4
		for n < len(send) && (n == 0 || total+4+len(bodies[send[n]]) <= c.limits.maxBody) {
			total += 4 + len(bodies[send[n]])
			n++
		}
		batches = append(batches, send[:n])
		send = send[n:]
	}
	c.pub.sendAll(ctx, name, bodies, batches, errs, opts.Durability == driver.DurabilityNone)
	return batchError(topic, msgs, errs)
}

// batchError is the result of a Publish: nil when every message landed,
// the error itself when all failed with one error (one command failed),
// else a *driver.MessageErrors.
func batchError(topic string, msgs []*driver.Message, errs []error) error {
	failed, same := 0, true
	for _, err := range errs {
		if err != nil {
			failed++
		}
		same = same && err == errs[0]
	}
	switch {
	case failed == 0:
		return nil
	case same && !errors.Is(errs[0], driver.ErrTooLarge):
		return fmt.Errorf("nsqbus: publish %q: %w", topic, errs[0])
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, driver.ErrTooLarge) {
			errs[i] = fmt.Errorf("nsqbus: publish %q: message %q: %w", topic, msgs[i].ID, err)
		}
	}
	return &driver.MessageErrors{Errs: errs}
}

// sendAll sends each batch (indexes into bodies) and records each
// message's outcome in errs. The commands go out one after the other
// without waiting, and are waited for together; a batch whose nsqd
// cannot be reached goes to the next nsqd (nothing was sent). With async
// set (durability none) nothing is waited for.
func (p *publisher) sendAll(ctx context.Context, topic string, bodies [][]byte, batches [][]int, errs []error, async bool) {
	type pending struct {
		batch []int
		done  <-chan error
	}
	var waits []pending
	for _, batch := range batches {
		done, err := p.send(ctx, topic, bodies, batch)
		if err != nil {
			for _, i := range batch {
				errs[i] = err
			}
			continue
		}
		if !async {
			waits = append(waits, pending{batch, done})
		}
	}
	for _, w := range waits {
		var err error
		select {
		case err = <-w.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil {
			continue
		}
		if tooLarge(err) && len(w.batch) > 1 {
			// nsqd refused the whole MPUB for one message (the limit it
			// enforces is below the one known here): nothing of it was
			// stored, so send each message alone to learn which.
			for _, i := range w.batch {
				errs[i] = p.sendOne(ctx, topic, bodies[i])
			}
			continue
		}
		err = p.c.publishError(err)
		for _, i := range w.batch {
			errs[i] = err
		}
	}
}

// sendOne publishes one body and waits for nsqd's answer.
func (p *publisher) sendOne(ctx context.Context, topic string, body []byte) error {
	done, err := p.send(ctx, topic, [][]byte{body}, []int{0})
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return p.c.publishError(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send writes one command to a producer, PUB for one message and MPUB
// for more, and returns the channel of its answer. It tries the nsqds in
// turn, starting with the next in round robin, while they cannot be
// reached (nothing was sent).
func (p *publisher) send(ctx context.Context, topic string, bodies [][]byte, batch []int) (<-chan error, error) {
	var cmd *nsq.Command
	if len(batch) == 1 {
		cmd = nsq.Publish(topic, bodies[batch[0]])
	} else {
		bs := make([][]byte, len(batch))
		for j, i := range batch {
			bs[j] = bodies[i]
		}
		var err error
		if cmd, err = nsq.MultiPublish(topic, bs); err != nil {
			return nil, err
		}
	}
	nodes, err := p.c.publishNodes(ctx, false)
	if err != nil {
		return nil, err
	}
	first := int(p.next.Add(1))
	var last error
	for try := range len(nodes) {
		if try == 1 && p.c.cfg.lookup {
			if fresh, err := p.c.publishNodes(ctx, true); err == nil {
				nodes = fresh
			}
		}
		addr := nodes[(first+try)%len(nodes)].tcp
		pr, err := p.producer(addr)
		if err != nil {
			return nil, err
		}
		done, err := pr.send(cmd)
		if err == nil {
			return done, nil
		}
		if errors.Is(err, driver.ErrClosed) {
			return nil, err
		}
		last = fmt.Errorf("nsqd %s: %w: %w", addr, p.c.clientError(err), driver.ErrRetryable)
	}
	return nil, last
}

// tooLarge reports whether nsqd refused a message or an MPUB body as too
// big (E_BAD_MESSAGE ... message too big, E_BAD_BODY ... body too big).
func tooLarge(err error) bool {
	var pe nsq.ErrProtocol
	return errors.As(err, &pe) && strings.Contains(pe.Reason, "too big")
}

// publishError classifies nsqd's refusal of a command: too big is
// driver.ErrTooLarge, a bad topic driver.ErrInvalid.
func (c *conn) publishError(err error) error {
	if err == nil {
		return nil
	}
	var pe nsq.ErrProtocol
	isProto := errors.As(err, &pe)
	switch {
	case tooLarge(err):
		return fmt.Errorf("nsqd refused it: %s: %w", pe.Reason, driver.ErrTooLarge)
	case isProto && strings.HasPrefix(pe.Reason, "E_BAD_TOPIC"):
		return fmt.Errorf("%s: %w", pe.Reason, driver.ErrInvalid)
	}
	return c.clientError(err)
}
