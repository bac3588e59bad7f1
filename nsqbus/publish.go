package nsqbus

// Publishing: one producer (producer.go) per nsqd, made on first use;
// Publish encodes the batch, refuses what is over nsqd's message size,
// sends the rest as MPUB commands within nsqd's body size, and maps
// nsqd's refusals. The commands of concurrent Publish calls pipeline on
// each producer's connection. Publish runs on its caller's goroutine;
// publisher.mu guards the producers.

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
		pr.wmu.Lock()
		defer pr.wmu.Unlock()
		_, err := pr.connect(ctx)
		done <- err
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
	out := getSending()
	*out = sending{p: c.pub, topic: name, errs: out.errs[:0], async: opts.Durability == driver.DurabilityNone, waits: out.waits[:0], sent: out.sent[:0]}
	out.errs = append(out.errs, make([]error, len(msgs))...)
	c.encodeBatches(topic, msgs, out.errs, func(b *batch) {
		out.send(ctx, b)
		out.sent = append(out.sent, b)
	})
	out.wait(ctx)
	// A batch nsqd answered goes back for the next Publish. One not
	// answered (durability none, or ctx ended) is left alone: its
	// command is pending, and a producer writes it again on a new
	// connection after nsqd refused one before it.
	for i, b := range out.sent {
		if b.done {
			putBatch(b)
		}
		out.sent[i] = nil
	}
	err = batchError(topic, msgs, out.errs)
	if err == nil {
		putSending(out)
	}
	return err
}

// batches and sendings are those of earlier Publish calls, to be
// written over: a batch's body is its size (up to nsqd's
// max-body-size), and a fresh one would be zeroed first; the rest
// (indexes, errors, answers) is a few bytes per message, which at 100
// bytes a message was a tenth of what a Publish allocated. A sending
// whose errors go to the caller is not reused.
var batches, sendings sync.Pool

// getBatch returns an empty batch whose body has room for about size.
func getBatch(size int) *batch {
	if b, ok := batches.Get().(*batch); ok && cap(b.body) >= size/2 {
		return b
	}
	return &batch{body: make([]byte, 4, size)}
}

func putBatch(b *batch) {
	b.body, b.idx, b.offs, b.done = b.body[:4], b.idx[:0], b.offs[:0], false
	batches.Put(b)
}

func getSending() *sending {
	if s, ok := sendings.Get().(*sending); ok {
		return s
	}
	return &sending{}
}

func putSending(s *sending) {
	clear(s.errs)
	clear(s.waits)
	*s = sending{errs: s.errs, waits: s.waits, sent: s.sent}
	sendings.Put(s)
}

// batch is the body of one MPUB: the count of messages, then the size
// and bytes of each, encoded in place, so the command needs no copy.
type batch struct {
	body []byte
	idx  []int // the messages' indexes in the Publish call
	offs []int // where each message starts in body (after its size)
	done bool  // answered: no command holds body any more
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
// hands each to emit as soon as it is complete, so that nsqd stores one
// while the next is encoded. It records in errs the messages over nsqd's
// message size, which are not sent.
func (c *conn) encodeBatches(topic string, msgs []*driver.Message, errs []error, emit func(*batch)) {
	est := func(m *driver.Message) int {
		if c.cfg.binary {
			return 4 + m.Size() + 16 + 4*len(m.Headers)
		}
		return 4 + len(m.Body)/3*4 + 4 + m.Size() - len(m.Body) + 160 + 8*len(m.Headers)
	}
	left := 4
	for _, m := range msgs {
		left += est(m)
	}
	// A batch's buffer takes what is left to encode, up to the body
	// size; a message that does not fit starts the next batch.
	newBatch := func() *batch { return getBatch(min(left, c.limits.maxBody)) }
	cur := newBatch()
	for i, m := range msgs {
		left -= est(m)
		start := len(cur.body)
		cur.body = append(cur.body, 0, 0, 0, 0)
		if c.cfg.binary {
			cur.body = encodeBinary(cur.body, m)
		} else {
			cur.body = encode(cur.body, m)
		}
		n := len(cur.body) - start - 4
		if n > c.limits.maxMsg {
			cur.body = cur.body[:start]
			errs[i] = fmt.Errorf("nsqbus: publish %q: message %q is %d bytes encoded, nsqd's max-msg-size is %d: %w",
				topic, m.ID, n, c.limits.maxMsg, driver.ErrTooLarge)
			continue
		}
		if len(cur.idx) > 0 && len(cur.body) > c.limits.maxBody {
			// Over the body size with this message: it starts the next.
			next := newBatch()
			next.body = append(next.body, cur.body[start:]...)
			cur.body = cur.body[:start]
			emit(cur)
			cur, start = next, 4
		}
		binary.BigEndian.PutUint32(cur.body[start:], uint32(n))
		cur.idx = append(cur.idx, i)
		cur.offs = append(cur.offs, start+4)
	}
	if len(cur.idx) > 0 {
		emit(cur)
	}
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

// sending is one Publish's batches on their way: each is sent as soon
// as it is encoded (send), and the answers are waited for together
// (wait); a batch whose nsqd cannot be reached goes to the next nsqd
// (nothing was sent). With async set (durability none) nothing is
// waited for. It records each message's outcome in errs.
type sending struct {
	p     *publisher
	topic string
	errs  []error
	async bool
	waits []pending
	sent  []*batch // every batch sent, to reuse once answered
}

type pending struct {
	b    *batch
	done <-chan error
}

func (s *sending) send(ctx context.Context, b *batch) {
	done, err := s.p.send(ctx, b.command(s.topic))
	if err != nil {
		for _, i := range b.idx {
			s.errs[i] = err
		}
		return
	}
	if !s.async {
		s.waits = append(s.waits, pending{b, done})
	}
}

func (s *sending) wait(ctx context.Context) {
	for _, w := range s.waits {
		var err error
		select {
		case err = <-w.done:
			w.b.done = true
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
				s.errs[i] = s.p.sendOne(ctx, nsq.Publish(s.topic, w.b.msg(j)))
			}
			w.b.done = ctx.Err() == nil // else a PUB of its bytes may wait still
			continue
		}
		err = s.p.c.publishError(err)
		for _, i := range w.b.idx {
			s.errs[i] = err
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
		done, err := pr.send(ctx, cmd)
		if err == nil {
			return done, nil
		}
		if errors.Is(err, driver.ErrClosed) {
			return nil, err
		}
		if errors.Is(err, driver.ErrInvalid) { // not an nsqd (checkNSQD): nothing was sent, and trying again would not help
			last = fmt.Errorf("nsqd %s: %w", addr, err)
			continue
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
