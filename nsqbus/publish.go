package nsqbus

// Publishing: one go-nsq Producer per nsqd, made on first use; Publish
// encodes the batch, refuses what is over nsqd's message size, sends
// the rest as MPUB commands within nsqd's body size, and maps nsqd's
// refusals. go-nsq pipelines the commands of concurrent Publish calls on
// each producer's connection. publisher.mu guards the producers.

import (
	"context"
	"encoding/binary"
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
	errs := make([]error, len(msgs))
	batches := c.encodeBatches(topic, msgs, errs)
	c.pub.sendAll(ctx, name, batches, errs, opts.Durability == driver.DurabilityNone)
	return batchError(topic, msgs, errs)
}

// batch is the body of one MPUB: the count of messages, then the size
// and bytes of each, encoded in place, so the command needs no copy.
type batch struct {
	body []byte
	idx  []int // the messages' indexes in the Publish call
	offs []int // where each message starts in body (after its size)
}

// msg returns the j-th message's bytes.
func (b *batch) msg(j int) []byte {
	end := len(b.body)
	if j+1 < len(b.offs) {
		end = b.offs[j+1] - 4
	}
	return b.body[b.offs[j]:end]
}

// command is the batch as a command: PUB for one message, MPUB for more.
func (b *batch) command(topic string) *nsq.Command {
	if len(b.idx) == 1 {
		return nsq.Publish(topic, b.msg(0))
	}
	binary.BigEndian.PutUint32(b.body, uint32(len(b.idx)))
	return &nsq.Command{Name: []byte("MPUB"), Params: [][]byte{[]byte(topic)}, Body: b.body}
}

// encodeBatches encodes msgs into batches within nsqd's body size, and
// records in errs the messages over its message size, which are not
// sent.
func (c *conn) encodeBatches(topic string, msgs []*driver.Message, errs []error) []*batch {
	size := 4
	for _, m := range msgs {
		size += 4 + len(m.Body)/3*4 + 4 + m.Size() - len(m.Body) + 160 + 8*len(m.Headers)
	}
	newBatch := func(size int) *batch { return &batch{body: make([]byte, 4, min(size, c.limits.maxBody+4))} }
	var batches []*batch
	cur := newBatch(size)
	for i, m := range msgs {
		start := len(cur.body)
		cur.body = append(cur.body, 0, 0, 0, 0)
		cur.body = encode(cur.body, m)
		n := len(cur.body) - start - 4
		if n > c.limits.maxMsg {
			cur.body = cur.body[:start]
			errs[i] = fmt.Errorf("nsqbus: publish %q: message %q is %d bytes as a CloudEvent, nsqd's max-msg-size is %d: %w",
				topic, m.ID, n, c.limits.maxMsg, driver.ErrTooLarge)
			continue
		}
		if len(cur.idx) > 0 && len(cur.body) > c.limits.maxBody {
			next := newBatch(size - start)
			next.body = append(next.body, cur.body[start:]...)
			cur.body = cur.body[:start]
			batches = append(batches, cur)
			cur, start = next, 4
		}
		binary.BigEndian.PutUint32(cur.body[start:], uint32(n))
		cur.idx = append(cur.idx, i)
		cur.offs = append(cur.offs, start+4)
	}
	if len(cur.idx) > 0 {
		batches = append(batches, cur)
	}
	return batches
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

// sendAll sends each batch and records each message's outcome in errs.
// The commands go out one after the other without waiting, and are
// waited for together; a batch whose nsqd cannot be reached goes to the
// next nsqd (nothing was sent). With async set (durability none) nothing
// is waited for.
func (p *publisher) sendAll(ctx context.Context, topic string, batches []*batch, errs []error, async bool) {
	type pending struct {
		b    *batch
		done <-chan error
	}
	var waits []pending
	for _, b := range batches {
		done, err := p.send(ctx, b.command(topic))
		if err != nil {
			for _, i := range b.idx {
				errs[i] = err
			}
			continue
		}
		if !async {
			waits = append(waits, pending{b, done})
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
		if tooLarge(err) && len(w.b.idx) > 1 {
			// nsqd refused the whole MPUB for one message (the limit it
			// enforces is below the one known here): nothing of it was
			// stored, so send each message alone to learn which.
			for j, i := range w.b.idx {
				errs[i] = p.sendOne(ctx, nsq.Publish(topic, w.b.msg(j)))
			}
			continue
		}
		err = p.c.publishError(err)
		for _, i := range w.b.idx {
			errs[i] = err
		}
	}
}

// sendOne sends a command and waits for nsqd's answer.
func (p *publisher) sendOne(ctx context.Context, cmd *nsq.Command) error {
	done, err := p.send(ctx, cmd)
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

// send writes cmd to a producer and returns the channel of its answer.
// It tries the nsqds in turn, starting with the next in round robin,
// while they cannot be reached (nothing was sent).
func (p *publisher) send(ctx context.Context, cmd *nsq.Command) (<-chan error, error) {
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
