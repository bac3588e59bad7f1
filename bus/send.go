package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/omnibus-go/omnibus"
)

// Dispatch is one send, as send middleware sees it: the encoded messages
// (headers, key and body filled in) bound for one topic, and the values
// they were made from (Values[i] is Messages[i]'s).
type Dispatch struct {
	Service  string // the sending service
	Kind     Kind
	To       string // the receiving service (commands), empty otherwise
	Topic    string
	Messages []*omnibus.Message
	Values   []any
}

// Sender publishes a dispatch.
type Sender func(ctx context.Context, d *Dispatch) error

// SendMiddleware wraps sends: Send, Publish, Request and Reply (faults
// included). Middleware given to
// [UseSend] runs in the order given, the first outermost, on every
// transport: after the bus has encoded the messages and set their
// headers, and around the publish. It may change headers (tracing), or
// refuse the send by returning an error, which the caller gets.
type SendMiddleware func(next Sender) Sender

// cause is what a context says about the message being handled.
type cause struct{ id, correlation string }

type causeKey struct{}

func withCause(ctx context.Context, m *omnibus.Message) context.Context {
	corr := m.Headers[HeaderCorrelationID]
	if corr == "" {
		corr = m.ID
	}
	return context.WithValue(ctx, causeKey{}, cause{id: m.ID, correlation: corr})
}

// Send sends commands to service: each is handled by one member of the
// service's group. Under a handler's ctx (or Invocation.Context) each
// is caused by the message being handled. A started bus names itself as
// the commands' reply path, so the handler can Reply; replies to Send go
// to the handlers of [HandleReply]. A command type the service has no
// handler for is dead-lettered there (see the package documentation).
func (b *Bus) Send(ctx context.Context, service string, cmds ...any) error {
	if err := checkName("service", service, false); err != nil {
		return err
	}
	return b.dispatch(ctx, Command, service, b.CommandTopic(service), cmds, nil)
}

// Publish publishes events to the service's event topic: every service
// that subscribes to them (HandleEvent with this service) handles each
// once.
func (b *Bus) Publish(ctx context.Context, events ...any) error {
	return b.dispatch(ctx, Event, "", b.EventTopic(b.service), events, nil)
}

// Request sends cmd to service and waits for its reply, which must be of
// type R. It is bounded by ctx's deadline: a ctx without one is refused
// (ErrNoDeadline), since a reply may never come (the handler keeps
// failing, the service is down). When the deadline passes first it
// returns an error wrapping ctx's error (context.DeadlineExceeded), and a
// reply arriving later is dropped and counted (Stats.LateReplies), never
// handed to another caller. When the handler fails permanently it returns
// a *FaultError at once. The bus must be started: replies come through
// the instance's reply path.
func Request[R any](ctx context.Context, b *Bus, service string, cmd any) (R, error) {
	var zero R
	rt := reflect.TypeFor[R]()
	info, err := b.infoFor(rt)
	if err != nil {
		return zero, err
	}
	if _, ok := ctx.Deadline(); !ok {
		return zero, fmt.Errorf("bus: request %T to %q: %w", cmd, service, ErrNoDeadline)
	}
	if err := checkName("service", service, false); err != nil {
		return zero, err
	}
	b.mu.Lock()
	live := b.started && !b.stopped
	b.mu.Unlock()
	if !live {
		return zero, fmt.Errorf("bus: request %T to %q: the bus is not running (Start runs the reply path): %w", cmd, service, errInvalid)
	}
	b.stats.requests.Add(1)
	var id string
	var ch chan *omnibus.Message
	err = b.dispatch(ctx, Command, service, b.CommandTopic(service), []any{cmd}, func(m *omnibus.Message) {
		id = m.ID
		m.Headers[HeaderRequestID] = id
		ch = b.await(id)
	})
	if ch != nil {
		defer b.forget(id)
	}
	if err != nil {
		return zero, err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return zero, fmt.Errorf("bus: request %T to %q: %w", cmd, service, omnibus.ErrClosed)
		}
		if m.Type == TypeFault {
			b.stats.faults.Add(1)
			var f faultBody
			if err := json.Unmarshal(m.Body, &f); err != nil {
				return zero, fmt.Errorf("bus: request %T to %q: fault unreadable: %v: %w", cmd, service, err, ErrDecode)
			}
			return zero, &FaultError{Service: f.Service, Type: f.Type, Reason: f.Reason}
		}
		if m.Type != info.name {
			return zero, fmt.Errorf("bus: request %T to %q: reply of type %q, want %q: %w", cmd, service, m.Type, info.name, ErrDecode)
		}
		h := &handler{kind: Reply, typ: info.name, info: info, decode: decoder[R](rt)}
		v, err := b.decode(h, m)
		if err != nil {
			return zero, err
		}
		return v.(R), nil
	case <-ctx.Done():
		b.stats.timeouts.Add(1)
		return zero, fmt.Errorf("bus: request %T to %q: no reply: %w", cmd, service, ctx.Err())
	}
}

// reply sends msgs as replies to m.
func (b *Bus) reply(ctx context.Context, m *omnibus.Message, msgs []any) error {
	to := m.Headers[HeaderReplyTo]
	if to == "" || m.Headers[HeaderReplyInstance] == "" {
		return fmt.Errorf("bus: reply to %q (type %q): %w", m.ID, m.Type, ErrNoReplyPath)
	}
	return b.dispatch(ctx, Reply, "", to, msgs, func(r *omnibus.Message) {
		b.addressReply(r, m)
	})
}

// addressReply sets r's headers (and key, if none) to answer m.
func (b *Bus) addressReply(r, m *omnibus.Message) {
	r.Headers[HeaderReplyInstance] = m.Headers[HeaderReplyInstance]
	if id := m.Headers[HeaderRequestID]; id != "" {
		r.Headers[HeaderRequestID] = id
	}
	if r.Key == "" {
		r.Key = m.Key
	}
}

// answer publishes r, a message the bus makes itself (a fault), as the
// reply to m, through the send middleware.
func (b *Bus) answer(ctx context.Context, m, r *omnibus.Message) error {
	r.ID, r.Headers = omnibus.NewID(), map[string]string{}
	b.addressReply(r, m)
	b.correlate(ctx, r)
	return b.send(ctx, &Dispatch{Service: b.service, Kind: Reply, Topic: m.Headers[HeaderReplyTo], Messages: []*omnibus.Message{r}, Values: []any{nil}})
}

// dispatch encodes values as messages of kind, lets edit adjust each,
// and sends them to topic through the send middleware.
func (b *Bus) dispatch(ctx context.Context, kind Kind, to, topic string, values []any, edit func(*omnibus.Message)) error {
	if len(values) == 0 {
		return nil
	}
	b.mu.Lock()
	live := b.started && !b.stopped
	b.mu.Unlock()
	d := &Dispatch{Service: b.service, Kind: kind, To: to, Topic: topic, Messages: make([]*omnibus.Message, len(values)), Values: values}
	for i, v := range values {
		m, err := b.encode(v)
		if err != nil {
			return fmt.Errorf("bus: %s to %q: %w", kind, topic, err)
		}
		b.correlate(ctx, m)
		if kind == Command && live {
			m.Headers[HeaderReplyTo] = b.replies.topic
			m.Headers[HeaderReplyInstance] = b.instance
		}
		if edit != nil {
			edit(m)
		}
		d.Messages[i] = m
	}
	if err := b.send(ctx, d); err != nil {
		return err
	}
	n := int64(len(values))
	switch kind {
	case Command:
		b.stats.sent.Add(n)
	case Event:
		b.stats.published.Add(n)
	case Reply:
		b.stats.replied.Add(n)
	}
	return nil
}

// encode makes the message of value v: a new ID, its type, the bus's
// service as source, its key (Keyer) and its body.
func (b *Bus) encode(v any) (*omnibus.Message, error) {
	if v == nil {
		return nil, fmt.Errorf("nil message: %w", errInvalid)
	}
	info, err := b.infoFor(reflect.TypeOf(v))
	if err != nil {
		return nil, err
	}
	codec := b.cfg.codec
	if info.proto {
		codec = Protobuf
	}
	body, err := codec.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s as %s: %w", info.name, codec.ContentType(), err)
	}
	m := &omnibus.Message{ID: omnibus.NewID(), Type: info.name, Source: b.service, ContentType: codec.ContentType(),
		Headers: map[string]string{}, Body: body}
	if k, ok := v.(Keyer); ok {
		m.Key = k.MessageKey()
	}
	return m, nil
}

// correlate sets m's causation and correlation from ctx's cause: a
// message sent outside a handler starts a conversation of its own.
func (b *Bus) correlate(ctx context.Context, m *omnibus.Message) {
	if c, ok := ctx.Value(causeKey{}).(cause); ok {
		m.Headers[HeaderCausationID] = c.id
		m.Headers[HeaderCorrelationID] = c.correlation
		return
	}
	m.Headers[HeaderCorrelationID] = m.ID
}

// publish is the innermost Sender.
func (b *Bus) publish(ctx context.Context, d *Dispatch) error {
	if TxFrom(ctx) != nil {
		return fmt.Errorf("bus: %s to %q: %w", d.Kind, d.Topic, ErrNoOutbox)
	}
	if err := b.ensureTopic(ctx, d.Topic); err != nil {
		return err
	}
	if err := b.c.Publish(ctx, d.Topic, d.Messages...); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}
