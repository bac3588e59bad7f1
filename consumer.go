package omnibus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Consumer runs a handler over a topic for one consumer group: the engine.
// It is created by Client.Subscribe or Client.SubscribeBatch and started by
// Run.
//
// # Delivery semantics
//
// At least once. A message is settled (acknowledged, or covered by a
// committed position) only after its handler returned nil or after it was
// dead-lettered. On logs the engine commits, per lane, the highest
// position below which every message is settled, so a message finishing
// early never commits past one still running. Handler errors are retried
// with exponential backoff and jitter, without blocking other keys or
// lanes; after MaxAttempts, or at once for a [Permanent] error, the
// message is published to the dead-letter topic with headers saying why,
// and then settled.
//
// # Concurrency
//
// Handlers run concurrently, bounded by MaxInFlight per member, in the
// order the Ordering mode promises. All methods may be called from any
// goroutine.
type Consumer struct {
	client  *Client
	topic   string
	cfg     consumerConfig
	handler Handler
	batch   BatchHandler
	logger  *slog.Logger
	hooks   hookSet         // the client's, then the consumer's
	values  context.Context // Subscribe's context without its cancellation: the handlers' parent

	settledMu sync.Mutex
	settled   map[string]*atomic.Int64 // per lane id, across members and claims

	mu       sync.Mutex
	members  []*member
	nextID   int
	started  bool
	stopping bool
	err      error
	done     chan struct{}
	doneOnce sync.Once
}

// Subscribe creates a consumer of topic that runs h for each message, and
// joins the consumer group (Group option, default a throwaway group). The
// consumer receives nothing until Run is called.
//
// A request the transport cannot keep (OrderLane or OrderKey on unordered
// lanes, StartEarliest without replay) fails here with a
// *CapabilityError.
func (c *Client) Subscribe(ctx context.Context, topic string, h Handler, opts ...SubscribeOption) (*Consumer, error) {
	if h == nil {
		return nil, fmt.Errorf("omnibus: subscribe %q: nil handler: %w", topic, ErrInvalid)
	}
	return c.subscribe(ctx, topic, h, nil, opts)
}

// SubscribeBatch is Subscribe for a handler that takes batches, formed as
// the Batch option says.
func (c *Client) SubscribeBatch(ctx context.Context, topic string, h BatchHandler, opts ...SubscribeOption) (*Consumer, error) {
	if h == nil {
		return nil, fmt.Errorf("omnibus: subscribe %q: nil handler: %w", topic, ErrInvalid)
	}
	return c.subscribe(ctx, topic, nil, h, opts)
}

func (c *Client) subscribe(ctx context.Context, topic string, h Handler, bh BatchHandler, opts []SubscribeOption) (*Consumer, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if topic == "" {
		return nil, fmt.Errorf("omnibus: subscribe: empty topic: %w", ErrInvalid)
	}
	cfg := defaultConsumerConfig(topic)
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("omnibus: subscribe %q: %w", topic, err)
		}
	}
	if err := c.checkCapabilities(&cfg); err != nil {
		return nil, err
	}
	if cfg.group == "" {
		cfg.group, cfg.ephemeral = "omnibus-"+NewID(), true
	}
	k := &Consumer{
		client:  c,
		topic:   topic,
		cfg:     cfg,
		handler: h,
		batch:   bh,
		logger:  c.logger.With("topic", topic, "group", cfg.group),
		values:  context.WithoutCancel(ctx),
		settled: map[string]*atomic.Int64{},
		done:    make(chan struct{}),
	}
	scope := HookScope{Transport: c.scheme, Consumer: k}
	k.hooks.add(bindHooks(c.rawHooks, scope)...)
	k.hooks.add(bindHooks(cfg.hooks, scope)...)
	if err := c.addConsumer(k); err != nil {
		return nil, fmt.Errorf("omnibus: subscribe %q: %w", topic, err)
	}
	for range cfg.consumers {
		if _, err := k.addMember(ctx); err != nil {
			k.Close()
			return nil, err
		}
	}
	return k, nil
}

func (c *Client) checkCapabilities(cfg *consumerConfig) error {
	if cfg.ordering == OrderDefault {
		cfg.ordering = OrderNone
		if c.caps.Ordered {
			cfg.ordering = OrderKey
		}
	}
	if (cfg.ordering == OrderLane || cfg.ordering == OrderKey) && !c.caps.Ordered {
		return &CapabilityError{Scheme: c.scheme, Capability: "ordering",
			Detail: fmt.Sprintf("ordering %s needs ordered lanes; use OrderNone, or the transport's partitioned mode", cfg.ordering)}
	}
	if cfg.startAt == StartEarliest && !c.caps.Replay {
		return &CapabilityError{Scheme: c.scheme, Capability: "replay",
			Detail: "a new group cannot start from the earliest message"}
	}
	return nil
}

// Topic is the topic the consumer reads.
func (k *Consumer) Topic() string { return k.topic }

// Group is the consumer group's name.
func (k *Consumer) Group() string { return k.cfg.group }

// addMember joins one more group member; the member starts fetching at
// once when the consumer is running.
func (k *Consumer) addMember(ctx context.Context) (*member, error) {
	k.mu.Lock()
	if k.stopping {
		k.mu.Unlock()
		return nil, fmt.Errorf("omnibus: consumer %q: %w", k.topic, ErrClosed)
	}
	id := k.nextID
	k.nextID++
	k.mu.Unlock()

	m := newMember(k, id)
	sub, err := k.client.conn.Subscribe(ctx, k.topic, driver.SubscribeOptions{
		Group:            k.cfg.group,
		Ephemeral:        k.cfg.ephemeral,
		StartAt:          k.cfg.startAt,
		MaxInFlight:      k.cfg.maxInFlight,
		MaxInFlightBytes: k.cfg.maxBytes,
		MaxHeld:          holdFactor * k.cfg.maxInFlight,
		Lanes:            m,
	})
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("omnibus: subscribe %q group %q: %w", k.topic, k.cfg.group, err)
	}
	if err := m.bind(sub); err != nil {
		_ = sub.Close()
		m.cancel()
		return nil, fmt.Errorf("omnibus: subscribe %q: %w", k.topic, err)
	}
	k.mu.Lock()
	if k.stopping {
		k.mu.Unlock()
		m.close()
		return nil, fmt.Errorf("omnibus: consumer %q: %w", k.topic, ErrClosed)
	}
	k.members = append(k.members, m)
	if k.started {
		m.start()
	}
	k.mu.Unlock()
	return m, nil
}

// Run starts the consumer and blocks until ctx ends (then it drains as
// Shutdown does, bounded by DrainTimeout, and returns what Shutdown
// returns: nil when everything received was settled and committed), until
// Shutdown or Close is called (nil), or until the transport fails in a way
// the engine cannot recover from (that error).
func (k *Consumer) Run(ctx context.Context) error {
	k.mu.Lock()
	if k.started {
		k.mu.Unlock()
		return fmt.Errorf("omnibus: consumer %q: Run called twice: %w", k.topic, ErrInvalid)
	}
	if k.stopping {
		k.mu.Unlock()
		return fmt.Errorf("omnibus: consumer %q: %w", k.topic, ErrClosed)
	}
	k.started = true
	for _, m := range k.members {
		m.start()
	}
	k.mu.Unlock()

	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.drainTimeout)
		defer cancel()
		err := k.Shutdown(sctx)
		if errors.Is(err, ErrClosed) {
			return nil // stopped meanwhile by Shutdown or Close
		}
		return err
	case <-k.done:
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.err
	}
}

// fail stops the consumer after an error it cannot recover from.
func (k *Consumer) fail(err error) {
	k.mu.Lock()
	if k.err == nil {
		k.err = err
	}
	k.mu.Unlock()
	k.logger.Error("consumer failed", "err", err)
	go k.Close() // not from the member's own goroutine, which Close waits for
}

// Shutdown stops fetching, lets every message already received finish
// (retries included), commits what is settled, leaves the group and
// returns. When ctx ends first, running handlers see their context
// cancelled, the rest is released to the transport (which delivers it
// again), and Shutdown returns an *UnsettledError wrapping ctx's error,
// without waiting for a handler that ignores its context (its result is
// discarded when it returns). A failed final commit or acknowledgement
// is returned too (errors.As finds each). Shutdown after Shutdown or
// Close returns ErrClosed.
//
// Shutdown called from a handler or observer (of any consumer) could wait
// for its caller: it returns an error wrapping ErrInvalid instead (cancel
// Run's context, or call Close, which is safe there).
func (k *Consumer) Shutdown(ctx context.Context) error {
	if calledFromEngine() {
		return k.reentered("shutdown")
	}
	members, ok := k.stop()
	if !ok {
		return fmt.Errorf("omnibus: shutdown %q: %w", k.topic, ErrClosed)
	}
	unsettled := 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, m := range members {
		wg.Go(func() {
			n, err := m.shutdown(ctx)
			mu.Lock()
			unsettled += n
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	k.finish()
	if unsettled > 0 {
		errs = append([]error{&UnsettledError{Topic: k.topic, Count: unsettled, Err: ctx.Err()}}, errs...)
	}
	return joinErrors(errs)
}

// Close stops the consumer at once: handlers see their context
// cancelled, nothing more is committed or acknowledged, and unsettled
// messages are delivered again by the transport later. Close waits for the
// handlers to return, so no goroutine outlives it, and returns the error
// of leaving the group, if any. Close is idempotent.
//
// Called from a handler or observer (of any consumer), Close cannot wait
// for its caller: it stops the consumer in the background and returns nil
// at once; the rest ends when the handler returns.
func (k *Consumer) Close() error {
	if calledFromEngine() {
		go k.Close()
		return nil
	}
	members, _ := k.stop()
	var wg sync.WaitGroup
	errs := make([]error, len(members))
	for i, m := range members {
		wg.Go(func() { errs[i] = m.close() })
	}
	wg.Wait()
	k.finish()
	return joinErrors(errs)
}

// reentered is the error of a call that would wait for its own caller.
func (k *Consumer) reentered(op string) error {
	return fmt.Errorf("omnibus: %s %q: called from a handler or observer, it could wait for itself "+
		"(cancel Run's context or call Close instead): %w", op, k.topic, ErrInvalid)
}

// joinErrors is errors.Join that returns a single error as itself.
func joinErrors(errs []error) error {
	errs = slices.DeleteFunc(errs, func(err error) bool { return err == nil })
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

func (k *Consumer) stop() ([]*member, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopping {
		return nil, false
	}
	k.stopping = true
	members := k.members
	k.members = nil
	return members, true
}

func (k *Consumer) finish() {
	k.doneOnce.Do(func() {
		k.client.removeConsumer(k)
		close(k.done)
	})
}

// Done is closed when the consumer has stopped.
func (k *Consumer) Done() <-chan struct{} { return k.done }

// Members is the number of group members running.
func (k *Consumer) Members() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.members)
}

// Scale sets the number of group members to n (at least 1): it joins new
// members, or shuts down the newest ones gracefully (their lanes are
// drained and committed before they move), bounded by ctx as Shutdown is.
// Called from a handler or observer (of any consumer) it returns an error
// wrapping ErrInvalid: it could wait for its caller.
func (k *Consumer) Scale(ctx context.Context, n int) error {
	if err := positive("consumers", n); err != nil {
		return err
	}
	if calledFromEngine() {
		return k.reentered("scale")
	}
	for {
		k.mu.Lock()
		if k.stopping {
			k.mu.Unlock()
			return fmt.Errorf("omnibus: scale %q: %w", k.topic, ErrClosed)
		}
		have := len(k.members)
		var victim *member
		if have > n {
			victim = k.members[have-1]
			k.members = k.members[:have-1]
		}
		k.mu.Unlock()
		switch {
		case have < n:
			if _, err := k.addMember(ctx); err != nil {
				return err
			}
		case victim != nil:
			left, err := victim.shutdown(ctx)
			if left > 0 {
				return joinErrors([]error{&UnsettledError{Topic: k.topic, Count: left, Err: ctx.Err()}, err})
			}
			if err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// backoff returns the delay before retry number attempt (1-based).
func (c *consumerConfig) backoff(attempt int) time.Duration {
	return driver.Backoff(attempt, c.backoffMin, c.backoffMax)
}

// Capabilities reports what the consumer's transport guarantees.
func (k *Consumer) Capabilities() Capabilities { return k.client.caps }
