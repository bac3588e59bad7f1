package natsbus

// Publishing: the CloudEvents NATS binding (headers to and from NATS
// messages) and Publish, which waits for JetStream's publish acks with at
// most the connection's window (conn.sem) outstanding. It runs on the
// caller's goroutine; a Publish cut short by its context leaves a
// goroutine that frees the window as the acks come in.

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strings"

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

// noRetry turns off nats.go's own retry of a publish that found no
// stream, which would send it after later messages (see publishAcked);
// made once, as an option costs an allocation.
var noRetry = jetstream.WithRetryAttempts(0)

type pending struct {
	i     int
	paf   jetstream.PubAckFuture
	epoch uint64 // the connection's reconnect count before it was sent
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
	var waiting []pending
	held := map[string]bool{} // keys with a message that failed republishably
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("natsbus: publish %q: message %q: %w", topic, msgs[i].ID, classify(err))
		if k := msgs[i].Key; k != "" && (errors.Is(errs[i], driver.ErrRetryable) || errors.Is(errs[i], driver.ErrOutcomeUnknown)) {
			held[k] = true
		}
	}
	epoch := func() uint64 { return c.nc.Stats().Reconnects }
	// wait settles the oldest pending publish; false when ctx ended.
	wait := func() bool {
		p := waiting[0]
		select {
		case <-p.paf.Ok():
		case err := <-p.paf.Err():
			fail(p.i, err)
		case <-ctx.Done():
			return false
		}
		waiting = waiting[1:]
		<-c.sem
		return true
	}
	abandon := func(from int) {
		// Not waited for: report ctx's error, and free the window when
		// the acks come in (the publish timeout bounds that).
		for _, p := range waiting {
			fail(p.i, ctx.Err())
		}
		for i := from; i < len(nm); i++ {
			if errs[i] == nil {
				fail(i, ctx.Err())
			}
		}
		if len(waiting) > 0 {
			rest := waiting
			go func() {
				for _, p := range rest {
					select {
					case <-p.paf.Ok():
					case <-p.paf.Err():
					}
					<-c.sem
				}
			}()
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
		for acquired := false; !acquired; {
			select {
			case c.sem <- struct{}{}:
				acquired = true
				continue
			default:
			}
			if len(waiting) > 0 {
				if !wait() {
					abandon(i)
					return
				}
				continue
			}
			select {
			case c.sem <- struct{}{}:
				acquired = true
			case <-ctx.Done():
				abandon(i)
				return
			}
		}
		e := epoch()
		if len(waiting) > 0 && waiting[0].epoch != e {
			// The connection changed under pending messages: learn
			// which of them it took along before sending more.
			for len(waiting) > 0 {
				if !wait() {
					<-c.sem
					abandon(i)
					return
				}
			}
		}
		if holdBack(i) {
			<-c.sem
			continue
		}
		var (
			paf jetstream.PubAckFuture
			err error
		)
		if c.nc.IsReconnecting() {
			err = fmt.Errorf("not sent, the connection is away: %w", nats.ErrConnectionReconnecting)
		} else {
			// Nats-Msg-Id is in the headers.
			paf, err = c.js.PublishMsgAsync(m, noRetry)
		}
		if err != nil {
			<-c.sem
			fail(i, err)
			continue
		}
		waiting = append(waiting, pending{i, paf, e})
	}
	for len(waiting) > 0 {
		if !wait() {
			abandon(len(nm))
			return
		}
	}
}
