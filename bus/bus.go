package bus

// The Bus: one instance of a named service, its topics and groups
// (Start subscribes them, Shutdown and Close stop them), and the routing
// of replies to the Requests waiting for them (b.mu guards the routes and
// the waiting Requests; consumers run the handlers on the engine's
// goroutines).

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/omnibus-go/omnibus"
)

// Kind is what a message is to the bus.
type Kind int

// Message kinds.
const (
	// Command: sent to one service, handled by one member of its group.
	Command Kind = iota + 1
	// Event: published by a service, handled once by every service that
	// subscribes to it.
	Event
	// Reply: the answer to a command, sent to the instance that sent it.
	Reply
)

func (k Kind) String() string {
	switch k {
	case Command:
		return "command"
	case Event:
		return "event"
	case Reply:
		return "reply"
	}
	return "unknown"
}

// Headers the bus writes. Their names are CloudEvents extension names
// (lowercase letters and digits), so they travel as extensions on every
// transport and CloudEvents readers and the CLI's tail show them.
const (
	// HeaderCausationID is the ID of the message whose handler sent this
	// one; absent on a message sent outside a handler.
	HeaderCausationID = "causationid"
	// HeaderCorrelationID is the ID of the conversation: the ID of the
	// first message of the flow, carried by every message it caused.
	HeaderCorrelationID = "correlationid"
	// HeaderReplyTo is the topic replies to a command go to (the sending
	// service's reply topic); set on commands sent by a started bus.
	HeaderReplyTo = "replyto"
	// HeaderReplyInstance is the sending instance's ID; replies carry it
	// back, and an instance handles only the replies that name it.
	HeaderReplyInstance = "replyinstance"
	// HeaderRequestID marks a command sent by Request (its value is the
	// command's ID) and the replies to it, which go to the waiting
	// Request and nowhere else.
	HeaderRequestID = "requestid"
)

// TypeFault is the message type of a reply saying that a request failed
// permanently in the handling service; Request returns it as a
// *FaultError.
const TypeFault = "omnibus.bus.Fault"

// Bus is one instance of a service on the bus: it holds the service's
// handlers, sends its messages and runs its consumers. Create it with
// [New], register handlers, then Start it. Its methods may be called from
// any goroutine.
type Bus struct {
	c        *omnibus.Client
	service  string
	instance string
	cfg      config
	send     Sender // the send middleware around publish

	types sync.Map // reflect.Type -> typeInfo

	mu       sync.Mutex
	started  bool
	stopped  bool
	routes   []*route // commands (if any), events by publisher, replies
	commands *route
	events   map[string]*route
	replies  *route
	pending  map[string]chan *omnibus.Message
	created  map[string]bool // topics made sure of with CreateTopic
	runs     sync.WaitGroup
	runErrs  []error

	stats stats
}

// route is one topic the instance reads and the handlers of the message
// types that arrive there.
type route struct {
	kind     Kind
	topic    string
	from     string // the publishing service of an event route
	handlers map[string]*handler
	batch    bool // a batch handler is registered: the consumer takes batches
	opts     []omnibus.SubscribeOption
	consumer *omnibus.Consumer
}

// New returns an instance of service on client c. service names the
// service's topics and its consumer groups: letters, digits, '-' and
// '_'. The bus does not own c: close it after the bus.
func New(c *omnibus.Client, service string, opts ...Option) (*Bus, error) {
	if c == nil {
		return nil, fmt.Errorf("bus: New: nil client: %w", errInvalid)
	}
	if err := checkName("service", service, false); err != nil {
		return nil, err
	}
	cfg := config{namespace: "bus", lanes: 4, codec: JSON}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	b := &Bus{
		c: c, service: service, instance: omnibus.NewID(), cfg: cfg,
		events:  map[string]*route{},
		pending: map[string]chan *omnibus.Message{},
		created: map[string]bool{},
	}
	b.replies = &route{kind: Reply, topic: b.replyTopic(service), handlers: map[string]*handler{}, opts: cfg.subReply}
	b.send = b.publish
	for i := len(cfg.sendMW) - 1; i >= 0; i-- {
		b.send = cfg.sendMW[i](b.send)
	}
	return b, nil
}

// checkName accepts letters, digits, '-' and '_' (and '.' between others
// where dots is true): names safe in every transport's topic and group
// names.
func checkName(what, s string, dots bool) error {
	ok := s != "" && s[0] != '.' && s[len(s)-1] != '.'
	for i := 0; ok && i < len(s); i++ {
		r := s[i]
		ok = r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' ||
			dots && r == '.' && s[i-1] != '.'
	}
	if !ok {
		return fmt.Errorf("bus: %s %q: want letters, digits, '-' and '_': %w", what, s, errInvalid)
	}
	return nil
}

// Service is the service's name.
func (b *Bus) Service() string { return b.service }

// Instance is this instance's ID, unique across processes: replies to the
// commands it sends carry it.
func (b *Bus) Instance() string { return b.instance }

// Client is the omnibus client the bus runs on.
func (b *Bus) Client() *omnibus.Client { return b.c }

// CommandTopic is the topic of service's commands:
// "<namespace>.<service>.commands".
func (b *Bus) CommandTopic(service string) string {
	return b.cfg.namespace + "." + service + ".commands"
}

// EventTopic is the topic of the events service publishes:
// "<namespace>.<service>.events".
func (b *Bus) EventTopic(service string) string {
	return b.cfg.namespace + "." + service + ".events"
}

func (b *Bus) replyTopic(service string) string {
	return b.cfg.namespace + "." + service + ".replies"
}

// Subscription is one topic an instance reads, and the group it reads it
// in.
type Subscription struct {
	Kind  Kind   // Command, Event or Reply
	Topic string // the topic
	Group string // the consumer group: the service, or the instance's throwaway group for replies
}

// Subscriptions lists what the started instance reads: its service's
// commands (when it handles any), the events of each service it
// subscribes to, and its service's replies in a throwaway group of its
// own.
func (b *Bus) Subscriptions() []Subscription {
	b.mu.Lock()
	defer b.mu.Unlock()
	subs := make([]Subscription, 0, len(b.routes))
	for _, r := range b.routes {
		if r.consumer != nil {
			subs = append(subs, Subscription{Kind: r.kind, Topic: r.topic, Group: r.consumer.Group()})
		}
	}
	return subs
}

// ensureTopic makes sure topic exists (Client.CreateTopic), once per bus.
func (b *Bus) ensureTopic(ctx context.Context, topic string) error {
	b.mu.Lock()
	done := b.created[topic]
	b.mu.Unlock()
	if done {
		return nil
	}
	if err := b.c.CreateTopic(ctx, topic, b.cfg.lanes); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	b.mu.Lock()
	b.created[topic] = true
	b.mu.Unlock()
	return nil
}

// Start creates the instance's topics, joins its consumer groups and
// runs its consumers. When it returns, every group of the instance is in
// place, so a message sent after Start returns reaches the instance's
// groups: omnibus.Client.Subscribe returns once the transport has placed
// the group (a Kafka group's first assignment, with its start
// committed; a RabbitMQ queue declared; a JetStream consumer created).
// Handlers cannot be registered after Start.
func (b *Bus) Start(ctx context.Context) error {
	b.mu.Lock()
	if b.started || b.stopped {
		b.mu.Unlock()
		return fmt.Errorf("bus: start %q: %w", b.service, ErrStarted)
	}
	b.started = true
	routes := []*route{b.replies}
	if b.commands != nil {
		routes = append(routes, b.commands)
	}
	for _, r := range b.events {
		routes = append(routes, r)
	}
	b.routes = routes
	b.mu.Unlock()

	for _, r := range routes {
		if err := b.ensureTopic(ctx, r.topic); err != nil {
			return b.failStart(err)
		}
		k, err := b.subscribe(ctx, r)
		if err != nil {
			return b.failStart(err)
		}
		b.mu.Lock()
		r.consumer = k
		b.mu.Unlock()
		b.runs.Go(func() {
			// ErrClosed: stopped before Run began.
			if err := k.Run(context.Background()); err != nil && !errors.Is(err, omnibus.ErrClosed) {
				b.mu.Lock()
				b.runErrs = append(b.runErrs, fmt.Errorf("bus: consumer of %q: %w", r.topic, err))
				b.mu.Unlock()
			}
		})
	}
	return nil
}

func (b *Bus) failStart(err error) error {
	_ = b.Close()
	return fmt.Errorf("bus: start %q: %w", b.service, err)
}

func (b *Bus) subscribe(ctx context.Context, r *route) (*omnibus.Consumer, error) {
	var opts []omnibus.SubscribeOption
	if r.kind != Reply {
		opts = append(append(opts, b.cfg.subAll...), r.opts...)
		opts = append(opts, omnibus.Group(b.service), omnibus.Hooks(faultHook{b}))
	} else {
		opts = r.opts // no Group: a throwaway group of this instance
	}
	if r.batch {
		return b.c.SubscribeBatch(ctx, r.topic, func(ctx context.Context, ms []*omnibus.Message) error {
			return batchResult(b.receive(ctx, r, ms))
		}, opts...)
	}
	return b.c.Subscribe(ctx, r.topic, func(ctx context.Context, m *omnibus.Message) error {
		return b.receive(ctx, r, []*omnibus.Message{m})[0]
	}, opts...)
}

// batchResult turns per-message outcomes into a batch handler's result.
func batchResult(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return &omnibus.BatchError{Errs: errs}
		}
	}
	return nil
}

// await registers a waiter for the reply to request id. A stopped bus
// returns a closed channel: no reply will come.
func (b *Bus) await(id string) chan *omnibus.Message {
	ch := make(chan *omnibus.Message, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		close(ch)
		return ch
	}
	b.pending[id] = ch
	return ch
}

func (b *Bus) forget(id string) {
	b.mu.Lock()
	delete(b.pending, id)
	b.mu.Unlock()
}

// deliver hands a reply to its waiter, which takes it out of pending so
// that a second reply finds none. It reports whether someone waited.
func (b *Bus) deliver(id string, m *omnibus.Message) bool {
	b.mu.Lock()
	ch, ok := b.pending[id]
	delete(b.pending, id)
	b.mu.Unlock()
	if !ok {
		return false
	}
	cp := *m
	cp.Headers = make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		cp.Headers[k] = v
	}
	cp.Body = append([]byte(nil), m.Body...)
	ch <- &cp
	return true
}

// Shutdown stops the instance's consumers gracefully (each drains and
// commits, as omnibus.Consumer.Shutdown does), bounded by ctx, and
// returns what they return, with any error a consumer stopped with
// earlier. Requests still waiting fail with omnibus.ErrClosed.
func (b *Bus) Shutdown(ctx context.Context) error {
	return b.stop(func(k *omnibus.Consumer) error { return k.Shutdown(ctx) })
}

// Close stops the instance's consumers at once (omnibus.Consumer.Close).
// It is idempotent.
func (b *Bus) Close() error {
	return b.stop(func(k *omnibus.Consumer) error { return k.Close() })
}

func (b *Bus) stop(fn func(*omnibus.Consumer) error) error {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return nil
	}
	b.stopped = true
	var ks []*omnibus.Consumer
	for _, r := range b.routes {
		if r.consumer != nil {
			ks = append(ks, r.consumer)
		}
	}
	for id, ch := range b.pending {
		close(ch)
		delete(b.pending, id)
	}
	b.mu.Unlock()
	errs := make([]error, len(ks))
	var wg sync.WaitGroup
	for i, k := range ks {
		wg.Go(func() {
			if err := fn(k); err != nil && !errors.Is(err, omnibus.ErrClosed) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	b.runs.Wait()
	b.mu.Lock()
	errs = append(errs, b.runErrs...)
	b.mu.Unlock()
	return errors.Join(errs...)
}

// infoFor returns the wire name of t, cached.
func (b *Bus) infoFor(t reflect.Type) (typeInfo, error) {
	if v, ok := b.types.Load(t); ok {
		return v.(typeInfo), nil
	}
	info, err := infoOf(t)
	if err != nil {
		return info, err
	}
	b.types.Store(t, info)
	return info, nil
}

// codecFor returns the codec of content type ct, or of the type when ct
// is empty.
func (b *Bus) codecFor(ct string, info typeInfo) (Codec, bool) {
	switch {
	case ct == "" && info.proto, ct == Protobuf.ContentType():
		return Protobuf, true
	case ct == "", ct == b.cfg.codec.ContentType():
		return b.cfg.codec, true
	case ct == JSON.ContentType():
		return JSON, true
	}
	return nil, false
}
