package omnibus

// Hooks: typed, optional callbacks for metrics and tracing, registered on
// a client (WithHooks: its publishes and every consumer) or on one
// consumer (Hooks). A hook implements any of the interfaces below; the
// engine looks for them once, when the client or the consumer is made,
// so a hook that is absent costs nothing per message.

import (
	"context"
	"time"
)

// A Hook is a value implementing one or more of PublishHook,
// PublishRetryHook, HandleHook, FetchHook, SettleHook, RetryHook,
// DeadLetterHook, CommitHook and LanesHook (package autoscale adds its
// DecisionHook), or a HookBinder that returns such a value for each place
// it is registered.
//
// # What a hook may do
//
// Hooks run on the engine's goroutines (a worker, the fetch or settle
// loop, a driver's goroutine inside a lane claim or revocation) and never
// while the engine holds a lock. A hook must be quick and must not block
// on the consumer: it may read Stats and Lag, but Shutdown and Scale
// called from a hook return an error wrapping ErrInvalid, and Close
// stops the consumer in the background without waiting for the hook's
// goroutine. A hook must not keep the Message it is given after it
// returns (copy what it needs). Hooks of one kind run in the order they
// were registered, the client's before the consumer's.
//
// A PublishHook's end for a Publisher runs on the Publisher's sender,
// before the messages it ends free their room: called from there, the
// Flush and Close of any Publisher, and a Publish that would wait for
// room, return an error wrapping ErrInvalid at once (on its own
// Publisher they would wait for themselves, and a stack cannot tell
// which Publisher it runs for).
type Hook any

// PublishHook sees every Client.Publish (not the engine's dead letters,
// which DeadLetterHook sees). OnPublish runs before the messages are
// converted for the transport, with their ID and Time filled: it may add
// headers (a trace context, say) and returns the context the publish
// continues with and a function called with its outcome.
type PublishHook interface {
	OnPublish(ctx context.Context, topic string, msgs []*Message) (context.Context, func(err error))
}

// HandleHook sees every handler call: OnHandle runs before it with the
// messages (one, or a batch) and returns the context the handler gets
// (it carries the values of the context given to Subscribe) and a
// function called with what the handler returned, after it returned.
type HandleHook interface {
	OnHandle(ctx context.Context, topic string, msgs []*Message) (context.Context, func(err error))
}

// FetchHook sees every Receive that returned deliveries.
type FetchHook interface {
	OnFetch(FetchInfo)
}

// FetchInfo describes one Receive.
type FetchInfo struct {
	Topic, Group string
	Member       int
	Count, Bytes int
	Took         time.Duration // how long Receive blocked
}

// SettleHook sees each message handled with success (EventProcessed) or
// failed (EventFailed) before what follows the failure.
type SettleHook interface {
	OnSettle(Event)
}

// RetryHook sees each retry scheduled (EventRetried).
type RetryHook interface {
	OnRetry(Event)
}

// DeadLetterHook sees each dead letter published (EventDeadLettered) or
// not (EventDeadLetterFailed).
type DeadLetterHook interface {
	OnDeadLetter(Event)
}

// CommitHook sees each commit of positions (EventCommitted) and each
// batch of acknowledgements (EventAcked).
type CommitHook interface {
	OnCommit(Event)
}

// LanesHook sees each lane claim, revocation and loss (EventClaimed,
// EventRevoked, EventLost).
type LanesHook interface {
	OnLanes(Event)
}

// A HookBinder is a hook that wants to know where it runs: the transport,
// and the consumer when it sees one. The engine calls BindHook once for
// the client that WithHooks registered it on (its publishes; Consumer
// nil) and once for each consumer of that client, or once for the
// consumer that Hooks registered it on, and uses what BindHook returns
// (nil: nothing) in its place. A hook that labels what it records with
// the transport, topic and group resolves those labels here, once,
// rather than per message. BindHook runs inside Open, New, Subscribe or
// SubscribeBatch, before the consumer runs; it must not block.
type HookBinder interface {
	BindHook(HookScope) Hook
}

// HookScope is where a bound hook runs.
type HookScope struct {
	// Transport names the client's transport: its URL scheme ("kafka",
	// "amqp", "nats", "mem"), or for a client made with New the driver's
	// package name ("membus").
	Transport string
	// Consumer is the consumer the hook is bound to; nil for the client's
	// publishes. The hook may keep it and read its Topic, Group, Stats,
	// Lag and Done, within the contract of Hook.
	Consumer *Consumer
}

// bindHooks returns hs with every HookBinder replaced by what it binds
// for scope.
func bindHooks(hs []Hook, scope HookScope) []Hook {
	out := make([]Hook, 0, len(hs))
	for _, h := range hs {
		if b, ok := h.(HookBinder); ok {
			if h = b.BindHook(scope); h == nil {
				continue
			}
		}
		out = append(out, h)
	}
	return out
}

// hookSet is the hooks found among some values, by kind.
type hookSet struct {
	publish      []PublishHook
	publishRetry []PublishRetryHook
	handle       []HandleHook
	fetch        []FetchHook
	settle       []SettleHook
	retry        []RetryHook
	deadLetter   []DeadLetterHook
	commit       []CommitHook
	lanes        []LanesHook
	events       bool // any of the event kinds
}

// add sorts hs into the set by the interfaces each implements.
func (s *hookSet) add(hs ...Hook) {
	for _, h := range hs {
		if h, ok := h.(PublishHook); ok {
			s.publish = append(s.publish, h)
		}
		if h, ok := h.(PublishRetryHook); ok {
			s.publishRetry = append(s.publishRetry, h)
		}
		if h, ok := h.(HandleHook); ok {
			s.handle = append(s.handle, h)
		}
		if h, ok := h.(FetchHook); ok {
			s.fetch = append(s.fetch, h)
		}
		if h, ok := h.(SettleHook); ok {
			s.settle = append(s.settle, h)
		}
		if h, ok := h.(RetryHook); ok {
			s.retry = append(s.retry, h)
		}
		if h, ok := h.(DeadLetterHook); ok {
			s.deadLetter = append(s.deadLetter, h)
		}
		if h, ok := h.(CommitHook); ok {
			s.commit = append(s.commit, h)
		}
		if h, ok := h.(LanesHook); ok {
			s.lanes = append(s.lanes, h)
		}
	}
	s.events = len(s.settle)+len(s.retry)+len(s.deadLetter)+len(s.commit)+len(s.lanes) > 0
}

// event calls the hooks of e's kind.
func (s *hookSet) event(e Event) {
	switch e.Kind {
	case EventProcessed, EventFailed:
		for _, h := range s.settle {
			h.OnSettle(e)
		}
	case EventRetried:
		for _, h := range s.retry {
			h.OnRetry(e)
		}
	case EventDeadLettered, EventDeadLetterFailed:
		for _, h := range s.deadLetter {
			h.OnDeadLetter(e)
		}
	case EventCommitted, EventAcked:
		for _, h := range s.commit {
			h.OnCommit(e)
		}
	case EventClaimed, EventRevoked, EventLost:
		for _, h := range s.lanes {
			h.OnLanes(e)
		}
	}
}

// wrap runs the hooks of one call in order: each gets the context the one
// before returned; the returned function calls their ends in reverse.
func wrap[T any](ctx context.Context, hooks []T, call func(T, context.Context) (context.Context, func(error))) (context.Context, func(error)) {
	ends := make([]func(error), len(hooks))
	for i, h := range hooks {
		ctx, ends[i] = call(h, ctx)
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			if ends[i] != nil {
				ends[i](err)
			}
		}
	}
}

// observerHook adapts an Observe function: it sees every event.
type observerHook func(Event)

func (f observerHook) OnSettle(e Event)     { f(e) }
func (f observerHook) OnRetry(e Event)      { f(e) }
func (f observerHook) OnDeadLetter(e Event) { f(e) }
func (f observerHook) OnCommit(e Event)     { f(e) }
func (f observerHook) OnLanes(e Event)      { f(e) }

// WithHooks registers hooks on the client: its publishes and every
// consumer it makes. Default: none.
func WithHooks(hooks ...Hook) Option {
	return func(c *clientConfig) error {
		c.hooks = append(c.hooks, hooks...)
		return nil
	}
}

// Hooks registers hooks on one consumer, after the client's. Default:
// none.
func Hooks(hooks ...Hook) SubscribeOption {
	return func(c *consumerConfig) error {
		c.hooks = append(c.hooks, hooks...)
		return nil
	}
}
