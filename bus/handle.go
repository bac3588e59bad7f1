package bus

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Call is one call of a handler, as handler middleware sees it: one
// message, or for a batch handler a run of messages of one type, with
// their decoded values (Values[i] is Messages[i]'s).
type Call struct {
	Service  string // the service handling the call
	Kind     Kind
	Type     string // the message type (omnibus.Message.Type)
	Messages []*omnibus.Message
	Values   []any
}

// Handler handles a call. Its result is the engine's: nil settles the
// messages, an error retries them, omnibus.Permanent dead-letters them,
// and an *omnibus.BatchError (one entry per message) settles message by
// message.
type Handler func(ctx context.Context, c *Call) error

// Middleware wraps handlers. Middleware given to [Use] runs in the order
// given, the first outermost, on every transport: after the bus has
// found the handler of the message's type and decoded the body (a message
// without a handler, or that does not decode, is dead-lettered before any
// middleware runs), and around the typed handler. Middleware may change
// ctx, which the handler receives, and may refuse a call by returning an
// error (omnibus.Permanent to dead-letter it at once).
type Middleware func(next Handler) Handler

// Invocation is what a handler gets besides its message: the message as
// received, its correlation, and the way to reply. It is valid while the
// handler runs.
type Invocation struct {
	b    *Bus
	m    *omnibus.Message
	kind Kind
	tx   *sql.Tx // the transaction ctx carried (WithTx), or nil
}

// Message is the message as received (headers, key, topic, lane,
// attempt). It must not be kept after the handler returns.
func (inv Invocation) Message() *omnibus.Message { return inv.m }

// Kind is the message's kind.
func (inv Invocation) Kind() Kind { return inv.kind }

// ID is the message's ID.
func (inv Invocation) ID() string { return inv.m.ID }

// CorrelationID is the ID of the conversation the message belongs to.
func (inv Invocation) CorrelationID() string { return inv.m.Headers[HeaderCorrelationID] }

// CausationID is the ID of the message whose handler sent this one,
// empty for a message sent outside a handler.
func (inv Invocation) CausationID() string { return inv.m.Headers[HeaderCausationID] }

// Context returns ctx carrying this message as the cause of what is sent
// with it: Send, Publish and Request under it write this message's ID as
// the causation ID and its conversation as theirs. A handler's own ctx
// already carries its message (a batch handler's carries none).
func (inv Invocation) Context(ctx context.Context) context.Context {
	return withCause(ctx, inv.m)
}

// Reply sends msgs to the instance that sent the command being handled,
// each caused by it; a Request waiting for it returns the first. The
// replies take the command's key unless they implement [Keyer]. A
// message that names no sender (an event, or a command not sent by a
// started bus) returns an error wrapping ErrNoReplyPath.
func (inv Invocation) Reply(ctx context.Context, msgs ...any) error {
	return inv.b.reply(withCause(ctx, inv.m), inv.m, msgs)
}

// Item is one message of a batch: its Invocation and its decoded value.
type Item[T any] struct {
	Invocation
	Value T
}

// handler is a registered handler of one message type.
type handler struct {
	kind   Kind
	typ    string
	info   typeInfo
	batch  bool
	decode func(c Codec, data []byte) (any, error)
	call   Handler // the middleware around the typed handler
}

// HandleCommand registers fn as the service's handler of commands of
// type T. A type has one command handler per service: a second
// registration returns an error wrapping ErrDuplicateHandler. Register
// before Start.
func HandleCommand[T any](b *Bus, fn func(ctx context.Context, inv Invocation, cmd T) error) error {
	return register[T](b, Command, "", false, single(b, fn))
}

// HandleEvent registers fn as the service's handler of events of type T
// published by the service from. Every subscribing service handles each
// event once (one member of its group).
func HandleEvent[T any](b *Bus, from string, fn func(ctx context.Context, inv Invocation, event T) error) error {
	return register[T](b, Event, from, false, single(b, fn))
}

// HandleReply registers fn as the instance's handler of replies of type
// T to commands it sent with Send. Replies to Request go to the waiting
// Request instead.
func HandleReply[T any](b *Bus, fn func(ctx context.Context, inv Invocation, reply T) error) error {
	return register[T](b, Reply, "", false, single(b, fn))
}

// HandleCommandBatch is HandleCommand for a handler that takes batches:
// the service's command consumer then takes batches (the omnibus.Batch
// option, through [SubscribeCommands], sets their size), and fn gets each
// run of consecutive commands of type T in a batch (other types' handlers
// run in between, in order).
func HandleCommandBatch[T any](b *Bus, fn func(ctx context.Context, items []Item[T]) error) error {
	return register[T](b, Command, "", true, batchOf(b, Command, fn))
}

// HandleEventBatch is HandleEvent for a handler that takes batches, as
// HandleCommandBatch.
func HandleEventBatch[T any](b *Bus, from string, fn func(ctx context.Context, items []Item[T]) error) error {
	return register[T](b, Event, from, true, batchOf(b, Event, fn))
}

func single[T any](b *Bus, fn func(context.Context, Invocation, T) error) Handler {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context, c *Call) error {
		return fn(ctx, Invocation{b: b, m: c.Messages[0], kind: c.Kind, tx: TxFrom(ctx)}, c.Values[0].(T))
	}
}

func batchOf[T any](b *Bus, kind Kind, fn func(context.Context, []Item[T]) error) Handler {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context, c *Call) error {
		items := make([]Item[T], len(c.Messages))
		for i, m := range c.Messages {
			items[i] = Item[T]{Invocation: Invocation{b: b, m: m, kind: kind, tx: TxFrom(ctx)}, Value: c.Values[i].(T)}
		}
		return fn(ctx, items)
	}
}

func register[T any](b *Bus, kind Kind, from string, batch bool, fn Handler) error {
	t := reflect.TypeFor[T]()
	if fn == nil {
		return fmt.Errorf("bus: register %s handler of %s: nil handler: %w", kind, t, errInvalid)
	}
	if kind == Event {
		if err := checkName("service", from, false); err != nil {
			return err
		}
	}
	info, err := b.infoFor(t)
	if err != nil {
		return err
	}
	h := &handler{kind: kind, typ: info.name, info: info, batch: batch, decode: decoder[T](t), call: fn}
	for i := len(b.cfg.handlerMW) - 1; i >= 0; i-- {
		h.call = b.cfg.handlerMW[i](h.call)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.stopped {
		return fmt.Errorf("bus: register %s handler of %s: %w", kind, info.name, ErrStarted)
	}
	var r *route
	switch kind {
	case Command:
		if b.commands == nil {
			b.commands = &route{kind: Command, topic: b.CommandTopic(b.service), handlers: map[string]*handler{}, opts: b.cfg.subCmd}
		}
		r = b.commands
	case Event:
		if b.events[from] == nil {
			b.events[from] = &route{kind: Event, topic: b.EventTopic(from), from: from, handlers: map[string]*handler{}, opts: b.cfg.subEvt[from]}
		}
		r = b.events[from]
	default:
		r = b.replies
	}
	if r.handlers[info.name] != nil {
		return fmt.Errorf("bus: register %s handler of %s in service %q (topic %q): %w", kind, info.name, b.service, r.topic, ErrDuplicateHandler)
	}
	r.handlers[info.name] = h
	r.batch = r.batch || batch
	return nil
}

// decoder returns a function that decodes a body into a new T.
func decoder[T any](t reflect.Type) func(Codec, []byte) (any, error) {
	if t.Kind() == reflect.Pointer {
		return func(c Codec, data []byte) (any, error) {
			p := reflect.New(t.Elem()).Interface()
			if err := c.Unmarshal(data, p); err != nil {
				return nil, err
			}
			return p.(T), nil
		}
	}
	return func(c Codec, data []byte) (any, error) {
		var v T
		if err := c.Unmarshal(data, &v); err != nil {
			return nil, err
		}
		return v, nil
	}
}

// receive handles the messages a consumer of route r delivers (one, or a
// batch) and returns each one's outcome.
func (b *Bus) receive(ctx context.Context, r *route, ms []*omnibus.Message) []error {
	errs := make([]error, len(ms))
	for i := 0; i < len(ms); {
		m := ms[i]
		if b.intercept(r, m) {
			i++
			continue
		}
		h := r.handlers[m.Type]
		if h == nil {
			errs[i] = b.noHandler(ctx, r, m)
			i++
			continue
		}
		// A run of messages of this type that decode: one call.
		call := &Call{Service: b.service, Kind: r.kind, Type: h.typ}
		j := i
		for j < len(ms) && (j == i || h.batch && ms[j].Type == h.typ && !b.special(r, ms[j])) {
			v, err := b.decode(h, ms[j])
			if err != nil {
				if j == i {
					b.stats.undecoded.Add(1)
					errs[j] = b.fault(ctx, ms[j], err)
					j++
				}
				break
			}
			call.Messages = append(call.Messages, ms[j])
			call.Values = append(call.Values, v)
			j++
		}
		if len(call.Messages) > 0 {
			b.run(ctx, h, call, errs[i:i+len(call.Messages)])
		}
		i = j
	}
	return errs
}

// run calls h and spreads its outcome over errs, one per message.
func (b *Bus) run(ctx context.Context, h *handler, call *Call, errs []error) {
	if len(call.Messages) == 1 {
		ctx = withCause(ctx, call.Messages[0])
	}
	err := h.call(ctx, call)
	var be *omnibus.BatchError
	if errors.As(err, &be) && len(be.Errs) == len(errs) {
		copy(errs, be.Errs)
	} else {
		for i := range errs {
			errs[i] = err
		}
	}
	for i, err := range errs {
		if err == nil {
			b.stats.handled.Add(1)
			continue
		}
		b.stats.failed.Add(1)
		if omnibus.IsPermanent(err) {
			errs[i] = b.fault(ctx, call.Messages[i], err)
		}
	}
}

// special reports whether m is handled by the bus itself, not by a
// handler: on the reply route, a reply to another instance or to a
// Request.
func (b *Bus) special(r *route, m *omnibus.Message) bool {
	return r.kind == Reply && (m.Headers[HeaderReplyInstance] != b.instance || m.Headers[HeaderRequestID] != "")
}

// intercept handles what the bus handles itself (see special) and
// reports whether it did; such messages are settled.
func (b *Bus) intercept(r *route, m *omnibus.Message) bool {
	switch {
	case !b.special(r, m):
		return false
	case m.Headers[HeaderReplyInstance] != b.instance:
		b.stats.other.Add(1)
	case !b.deliver(m.Headers[HeaderRequestID], m):
		b.stats.late.Add(1)
	}
	return true
}

// noHandler is the outcome of a message no handler takes: events of
// other types are skipped (the service reads all of a publisher's
// events); commands and replies are dead-lettered.
func (b *Bus) noHandler(ctx context.Context, r *route, m *omnibus.Message) error {
	if r.kind == Event {
		b.stats.skipped.Add(1)
		return nil
	}
	b.stats.unhandled.Add(1)
	return b.fault(ctx, m, fmt.Errorf("bus: service %q has no %s handler for type %q (topic %q): %w", b.service, r.kind, m.Type, r.topic, ErrNoHandler))
}

func (b *Bus) decode(h *handler, m *omnibus.Message) (any, error) {
	codec, ok := b.codecFor(m.ContentType, h.info)
	if !ok {
		return nil, fmt.Errorf("bus: decode %s %q: no codec for content type %q: %w", h.kind, h.typ, m.ContentType, ErrDecode)
	}
	v, err := h.decode(codec, m.Body)
	if err != nil {
		return nil, fmt.Errorf("bus: decode %s %q as %s: %v: %w", h.kind, h.typ, codec.ContentType(), err, ErrDecode)
	}
	return v, nil
}

// fault returns err as a permanent error (the engine dead-letters the
// message with err as the reason) after telling a waiting Request. If the
// fault cannot be sent, the message is retried instead, so the requester
// hears of it at least once.
func (b *Bus) fault(ctx context.Context, m *omnibus.Message, err error) error {
	if !omnibus.IsPermanent(err) {
		err = omnibus.Permanent(err)
	}
	if !awaited(m) {
		return err
	}
	if ferr := b.sendFault(ctx, m, err.Error()); ferr != nil {
		return fmt.Errorf("bus: tell the requester of %q: %w (the failure: %v)", m.ID, ferr, err)
	}
	return err
}

// awaited reports whether a Request waits for m's answer.
func awaited(m *omnibus.Message) bool {
	return m.Headers[HeaderRequestID] != "" && m.Headers[HeaderReplyTo] != "" && m.Type != TypeFault
}

// sendFault tells the Request waiting for m that m failed for reason.
func (b *Bus) sendFault(ctx context.Context, m *omnibus.Message, reason string) error {
	body, _ := json.Marshal(faultBody{Service: b.service, Type: m.Type, Reason: reason})
	f := &omnibus.Message{Type: TypeFault, Source: b.service, ContentType: JSON.ContentType(), Body: body}
	if err := b.answer(withCause(ctx, m), m, f); err != nil {
		return err
	}
	b.stats.replied.Add(1)
	return nil
}

// faultHook tells a waiting Request of a command that the engine
// dead-lettered after its last attempt; those the handler failed
// permanently were told already (see fault). Hooks must not block: the
// fault is sent from a goroutine of the bus.
type faultHook struct{ b *Bus }

func (h faultHook) OnDeadLetter(e omnibus.Event) {
	m := e.Message
	if e.Kind != omnibus.EventDeadLettered || m == nil || omnibus.IsPermanent(e.Err) || !awaited(m) {
		return
	}
	cp := &omnibus.Message{ID: m.ID, Key: m.Key, Type: m.Type, Headers: maps.Clone(m.Headers)}
	reason := fmt.Sprintf("%v (attempt %d, the last)", e.Err, m.Attempt)
	h.b.runs.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = h.b.sendFault(ctx, cp, reason) // lost: the Request waits for its deadline
	})
}

type faultBody struct {
	Service string `json:"service"`
	Type    string `json:"type"`
	Reason  string `json:"reason"`
}
