package natsbus

// Publishing: the CloudEvents NATS binding (headers to and from NATS
// messages) and Publish, which waits for JetStream's publish acks with at
// most the connection's window (conn.sem) outstanding. It runs on the
// caller's goroutine; the acks arrive through jetstream's callbacks on
// the connection's reader (onPubAck), which free the window, also for a
// Publish cut short by its context.

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// Header names of the CloudEvents NATS protocol binding (binary content
// mode); see the package comment for the rest of the mapping. Received
// names are read in any case, so the Ce-Id spelling omnibus wrote before
// it followed the binding is read too.
const (
	HeaderID           = "ce-id"
	HeaderType         = "ce-type"
	HeaderSource       = "ce-source"
	HeaderTime         = "ce-time"
	HeaderSpecVersion  = "ce-specversion"
	HeaderPartitionKey = "ce-partitionkey"
	HeaderContentType  = "ce-datacontenttype"
)

// headerValue is v as a NATS header carries it: CR and LF, which would
// end it, made spaces, and the white space at either end dropped, as
// nats.go drops it on the wire. What headerValue returns arrives as it
// is.
func headerValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ").Replace(v)
	}
	return textproto.TrimString(v)
}

// serverHeader reports whether k is in the server's namespace (Nats-Msg-Id,
// Nats-Expected-Stream, Nats-Rollup, ...): the server acts on those.
func serverHeader(k string) bool {
	return len(k) >= 5 && strings.EqualFold(k[:5], "Nats-")
}

// checkHeaderKey refuses a header name nats.go would refuse (the whole
// publish, with nats.ErrBadHeaderMsg): it takes printable ASCII but
// none of "()/,:;<=>?@[\]{} and the double quote.
func checkHeaderKey(k string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("header name %q: character %q is not allowed in a NATS header name", k, c)
		}
	}
	if serverHeader(k) {
		return fmt.Errorf("header name %q: the Nats- prefix is the server's", k)
	}
	return nil
}

// toMsg builds the NATS message of m on subject.
func toMsg(subject string, m *driver.Message) (*nats.Msg, error) {
	for k := range m.Headers {
		if err := checkHeaderKey(k); err != nil {
			return nil, err
		}
	}
	// One backing array for every header's single value: a message's
	// headers cost two allocations (the map and the array), not one per
	// header. Up to 7 attributes besides the user's headers, and
	// Nats-Msg-Id.
	h := make(nats.Header, len(m.Headers)+8)
	vals := make([]string, 0, len(m.Headers)+8)
	set := func(name, value string) {
		vals = append(vals, value)
		n := len(vals)
		h[name] = vals[n-1 : n : n]
	}
	driver.NATSBinding.Encode(m, func(name, value string) { set(name, headerValue(value)) })
	set(jetstream.MsgIDHeader, m.ID)
	return &nats.Msg{Subject: subject, Header: h, Data: m.Body}, nil
}

// fromMsg fills d's message from a NATS message. The server's headers are
// left out; Nats-Msg-Id is the ID of a message without ce-id. A message
// in structured content mode (its Content-Type says so, or, as the
// binding's first version had every message, it has no header and its
// payload is a CloudEvent) is decoded from its payload.
func fromMsg(d *driver.Message, h nats.Header, data []byte) {
	d.Body = data
	headers := false
	for k, vs := range h {
		switch {
		case len(vs) == 0:
		case k == jetstream.MsgIDHeader:
			if d.ID == "" {
				d.ID = vs[0]
			}
		case serverHeader(k):
		default:
			headers = true
			driver.NATSBinding.Decode(d, k, vs[0])
		}
	}
	if driver.Structured(d.ContentType) || !headers && len(data) > 0 && data[0] == '{' {
		_ = driver.DecodeStructured(d) // one that is no CloudEvent stays as it came
	}
}

// Publish implements driver.Conn. DurabilityNone publishes with core
// NATS and does not wait; leader and all wait for JetStream's publish
// ack. Up to publish_window messages of the connection wait for their
// ack at once.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	if err := checkTopic("publish", topic); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ref, err := c.stream(ctx, topic, 0)
	if err != nil {
		return err
	}
	errs := make([]error, len(msgs))
	nm := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		subject := topic
		if ref.parts > 0 {
			p := 0
			if m.Key == "" {
				p = int(c.rr.Add(1) % uint64(ref.parts))
			} else {
				p = Partition(m.Key, ref.parts)
			}
			subject = partitionSubject(topic, p)
		}
		nm[i], errs[i] = toMsg(subject, m)
		if errs[i] != nil {
			errs[i] = fmt.Errorf("natsbus: publish %q: message %q: %w: %w", topic, m.ID, errs[i], driver.ErrInvalid)
		}
	}
	if opts.Durability == driver.DurabilityNone {
		for i, m := range nm {
			if errs[i] == nil {
				if err := c.nc.PublishMsg(m); err != nil {
					errs[i] = fmt.Errorf("natsbus: publish %q: message %q: %w", topic, msgs[i].ID, classify(err))
				}
			}
		}
		return batchResult(errs)
	}
	c.publishAcked(ctx, topic, msgs, nm, errs)
	// A stream deleted under a cached reference: create it again and
	// publish what found no stream once more (the message IDs make this
	// safe). A message held back behind one published again here goes
	// along, in order; a key with a message that failed otherwise keeps
	// its failures, for the ride-through to publish in order.
	var again []int
	stopped := map[string]bool{}
	for i, err := range errs {
		k := msgs[i].Key
		switch {
		case err == nil:
		case k != "" && stopped[k]:
		case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, errHeldBack):
			again = append(again, i)
		case k != "":
			stopped[k] = true
		}
	}
	if len(again) > 0 && ctx.Err() == nil {
		c.forget(topic)
		if _, err := c.stream(ctx, topic, ref.parts); err == nil {
			sub := make([]*driver.Message, len(again))
			subN := make([]*nats.Msg, len(again))
			subE := make([]error, len(again))
			for j, i := range again {
				sub[j], subN[j] = msgs[i], nm[i]
			}
			c.publishAcked(ctx, topic, sub, subN, subE)
			for j, i := range again {
				errs[i] = subE[j]
			}
		}
	}
	return batchResult(errs)
}

func batchResult(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return &driver.MessageErrors{Errs: errs}
		}
	}
	return nil
}

// pending is a message of a publishAcked call sent and not yet settled
// by the call.
type pending struct {
	i     int
	epoch uint64 // the connection's reconnect count before it was sent
}

// pubRef is an asynchronous publish awaiting its ack: message i of w.
type pubRef struct {
	w *pubWaiter
	i int
}

// pubWaiter holds the outcomes of one publishAcked call's messages, set
// by jetstream's ack and error callbacks (conn.onPubAck) as they come.
// It wakes the call only for the outcome it waits for (the oldest
// message's when the window is full, the last one's at the end), so a
// batch costs the call a wake-up or two rather than one per message, and
// no channel per message.
type pubWaiter struct {
	mu   sync.Mutex
	errs []error // by message index, once done
	done []bool
	out  int           // sent, outcome not come
	want int           // the index whose outcome wakes the call; wantAll, wantNone
	wake chan struct{} // capacity 1
}

// noRetry turns off nats.go's own retry of a publish that found no
// stream, which would send it after later messages (see publishAcked);
// made once, as an option costs an allocation.
var noRetry = jetstream.WithRetryAttempts(0)

const (
	wantNone = -1
	wantAll  = -2 // the outcome that leaves none outstanding
)

func newPubWaiter(n int) *pubWaiter {
	return &pubWaiter{errs: make([]error, n), done: make([]bool, n), want: wantNone, wake: make(chan struct{}, 1)}
}

// onPubAck settles the asynchronous publish of m (err nil: acknowledged)
// and frees its place in the window. jetstream calls it once for every
// publish PublishMsgAsync took: with the ack, the error in the ack, the
// publish timeout, or ErrDisconnected when the connection drops.
func (c *conn) onPubAck(m *nats.Msg, err error) {
	c.pubMu.Lock()
	ref, ok := c.pubs[m]
	delete(c.pubs, m)
	c.pubMu.Unlock()
	if !ok {
		return
	}
	<-c.sem
	w := ref.w
	w.mu.Lock()
	w.out--
	w.errs[ref.i], w.done[ref.i] = err, true
	wake := w.want == ref.i || w.want == wantAll && w.out == 0
	w.mu.Unlock()
	if wake {
		driver.Notify(w.wake)
	}
}

// await waits for the outcome of message i (with wantAll: of every
// message sent); false when ctx ended first.
func (w *pubWaiter) await(ctx context.Context, i int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for !(i == wantAll && w.out == 0 || i >= 0 && w.done[i]) {
		w.want = i
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-ctx.Done():
			w.mu.Lock()
			w.want = wantNone
			return false
		}
		w.mu.Lock()
	}
	w.want = wantNone
	return true
}

// errHeldBack marks a message not sent because an earlier message of its
// key in the same call failed in a way that is tried again: sending it
// could store it before that one.
var errHeldBack = errors.New("not sent: an earlier message of its key failed first")

// publishAcked publishes the messages whose errs entry is nil
// asynchronously and waits for their acks, holding at most the
// connection's window of unacknowledged messages.
//
// Key order. The messages of a key are sent in the order given, and once
// one of them fails in a way omnibus tries again (ErrRetryable,
// ErrOutcomeUnknown), the later ones of its key are not sent: they fail
// ErrRetryable (errHeldBack), so the ride-through publishes them again
// after it, in order. On one connection the server stores what it takes
// in the order sent, so what was sent before the failure was known
// either landed in order or failed too. A reconnect ends that: before
// sending on a connection other than the one its pending messages went
// out on, publishAcked waits for all of them (nats.go fails those the
// old connection took with it), so a key whose message was lost is held
// back before anything of it goes out on the new connection. The
// connection has no reconnect buffer (see open), so nothing published
// while it is away is sent later behind the call's back, and nats.go's
// own asynchronous retry of a publish that found no stream (which would
// send it after later messages) is off.
func (c *conn) publishAcked(ctx context.Context, topic string, msgs []*driver.Message, nm []*nats.Msg, errs []error) {
	w := newPubWaiter(len(nm))
	var waiting []pending
	held := map[string]bool{} // keys with a message that failed republishably
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("natsbus: publish %q: message %q: %w", topic, msgs[i].ID, classify(err))
		if k := msgs[i].Key; k != "" && (errors.Is(errs[i], driver.ErrRetryable) || errors.Is(errs[i], driver.ErrOutcomeUnknown)) {
			held[k] = true
		}
	}
	epoch := func() uint64 { return c.nc.Stats().Reconnects }
	// take settles the oldest pending publishes whose outcome came, in
	// order.
	take := func() {
		w.mu.Lock()
		n := 0
		for ; n < len(waiting) && w.done[waiting[n].i]; n++ {
			if err := w.errs[waiting[n].i]; err != nil {
				fail(waiting[n].i, err)
			}
		}
		w.mu.Unlock()
		waiting = waiting[n:]
	}
	abandon := func(from int) {
		// Not waited for: report ctx's error. onPubAck frees their
		// places in the window as the outcomes come (the publish timeout
		// bounds that).
		for _, p := range waiting {
			fail(p.i, ctx.Err())
		}
		for i := from; i < len(nm); i++ {
			if errs[i] == nil {
				fail(i, ctx.Err())
			}
		}
	}
	holdBack := func(i int) bool {
		if k := msgs[i].Key; k != "" && held[k] {
			errs[i] = fmt.Errorf("natsbus: publish %q: message %q: %w: %w", topic, msgs[i].ID, errHeldBack, driver.ErrRetryable)
			return true
		}
		return false
	}
	for i, m := range nm {
		if errs[i] != nil || holdBack(i) {
			continue
		}
		select {
		case c.sem <- struct{}{}:
		default:
			// The window is full: learn what failed meanwhile, then
			// wait for a place (onPubAck frees them).
			take()
			if holdBack(i) {
				continue
			}
			select {
			case c.sem <- struct{}{}:
			case <-ctx.Done():
				abandon(i)
				return
			}
		}
		e := epoch()
		if len(waiting) > 0 && waiting[0].epoch != e {
			// The connection changed under pending messages: learn
			// which of them it took along before sending more.
			if !w.await(ctx, wantAll) {
				<-c.sem
				abandon(i)
				return
			}
			take()
		}
		if holdBack(i) {
			<-c.sem
			continue
		}
		var err error
		if c.nc.IsReconnecting() {
			err = fmt.Errorf("not sent, the connection is away: %w", nats.ErrConnectionReconnecting)
		} else {
			// Registered first: the ack may come before PublishMsgAsync
			// returns.
			w.mu.Lock()
			w.out++
			w.mu.Unlock()
			c.pubMu.Lock()
			c.pubs[m] = pubRef{w, i}
			c.pubMu.Unlock()
			// Nats-Msg-Id is in the headers.
			_, err = c.js.PublishMsgAsync(m, noRetry)
			if err != nil {
				c.pubMu.Lock()
				_, mine := c.pubs[m]
				delete(c.pubs, m)
				c.pubMu.Unlock()
				if !mine {
					// Settled by a callback meanwhile (a reconnect
					// failed it): its outcome is in w, and its place
					// freed.
					waiting = append(waiting, pending{i, e})
					continue
				}
				w.mu.Lock()
				w.out--
				w.mu.Unlock()
			}
		}
		if err != nil {
			<-c.sem
			fail(i, err)
			continue
		}
		waiting = append(waiting, pending{i, e})
	}
	if len(waiting) > 0 && !w.await(ctx, wantAll) {
		abandon(len(nm))
		return
	}
	take()
}
