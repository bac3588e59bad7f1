package omnibus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/membus"
)

type ctxKey string

// recorder is a hook of every kind, counting what it sees.
type recorder struct {
	mu        sync.Mutex
	name      string
	order     *[]string // shared: the order hooks ran in
	published map[string]error
	handled   map[string]error
	values    map[string]string // message ID -> the handler context's values
	fetched   int
	kinds     map[omnibus.EventKind]int
}

func newRecorder(name string, order *[]string) *recorder {
	return &recorder{name: name, order: order, published: map[string]error{}, handled: map[string]error{}, values: map[string]string{}, kinds: map[omnibus.EventKind]int{}}
}

func (r *recorder) OnPublish(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	r.mu.Lock()
	*r.order = append(*r.order, r.name+".publish")
	r.mu.Unlock()
	for _, m := range msgs {
		if m.ID == "" {
			panic("OnPublish before the ID was filled")
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers["hooked"+r.name] = "yes" // a hook may add headers (a trace context)
	}
	return context.WithValue(ctx, ctxKey("publish"), r.name), func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			r.published[m.ID] = err
		}
	}
}

func (r *recorder) OnHandle(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	ctx = context.WithValue(ctx, ctxKey("handle"), r.name)
	return ctx, func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			r.handled[m.ID] = err
		}
	}
}

func (r *recorder) OnFetch(info omnibus.FetchInfo) {
	r.mu.Lock()
	r.fetched += info.Count
	r.mu.Unlock()
}

func (r *recorder) event(e omnibus.Event) {
	r.mu.Lock()
	r.kinds[e.Kind]++
	r.mu.Unlock()
}
func (r *recorder) OnSettle(e omnibus.Event)     { r.event(e) }
func (r *recorder) OnRetry(e omnibus.Event)      { r.event(e) }
func (r *recorder) OnDeadLetter(e omnibus.Event) { r.event(e) }
func (r *recorder) OnCommit(e omnibus.Event)     { r.event(e) }
func (r *recorder) OnLanes(e omnibus.Event)      { r.event(e) }

// Hooks of every kind see what the engine does, in the order they were
// registered (the client's first); a handler's context carries the values
// of Subscribe's context and what handle hooks added.
func TestHooks(t *testing.T) {
	var order []string
	client, consumer := newRecorder("C", &order), newRecorder("K", &order)
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 2}).Conn(), quiet(), omnibus.WithHooks(client))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	values := map[string][3]any{}
	sctx := context.WithValue(context.Background(), ctxKey("subscribe"), "S")
	k, err := c.Subscribe(sctx, "hooks", func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		values[m.ID] = [3]any{ctx.Value(ctxKey("subscribe")), ctx.Value(ctxKey("handle")), m.Headers["hookedC"]}
		mu.Unlock()
		switch string(m.Body) {
		case "retry":
			if m.Attempt == 1 {
				return errors.New("once")
			}
		case "dead":
			return omnibus.Permanent(errors.New("poison"))
		}
		return nil
	}, omnibus.Hooks(consumer), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Backoff(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ms := []*omnibus.Message{{Body: []byte("ok")}, {Body: []byte("retry")}, {Body: []byte("dead")}}
	if err := c.Publish(context.Background(), "hooks", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	waitFor(t, func() bool { return k.Stats().Processed == 3 }, "three messages settled")
	if err := k.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(order) != 1 || order[0] != "C.publish" { // a consumer's hooks see no publish
		t.Errorf("publish hooks ran %v, want the client's hook once", order)
	}
	for _, m := range ms {
		if err, ok := client.published[m.ID]; !ok || err != nil {
			t.Errorf("publish hook outcome for %s: seen %v, err %v", m.Body, ok, err)
		}
		v := values[m.ID]
		if v[0] != "S" || v[1] != "K" || v[2] != "yes" {
			t.Errorf("handler of %s saw subscribe value %v, handle value %v (the last hook), header %v; want S, K, yes", m.Body, v[0], v[1], v[2])
		}
	}
	for _, r := range []*recorder{client, consumer} {
		r.mu.Lock()
		if r.handled[ms[0].ID] != nil || r.handled[ms[1].ID] != nil || r.handled[ms[2].ID] == nil {
			t.Errorf("%s: handle outcomes %v; want nil for ok and retry (their last call), an error for dead", r.name, r.handled)
		}
		if r.fetched < 3 {
			t.Errorf("%s: fetch hooks saw %d messages, want at least 3", r.name, r.fetched)
		}
		for _, kind := range []omnibus.EventKind{omnibus.EventProcessed, omnibus.EventFailed, omnibus.EventRetried, omnibus.EventDeadLettered, omnibus.EventCommitted, omnibus.EventClaimed} {
			if r.kinds[kind] == 0 {
				t.Errorf("%s: no %v event; saw %v", r.name, kind, r.kinds)
			}
		}
		r.mu.Unlock()
	}
}

// binder records the scopes it is bound to and binds a recorder per
// scope, or nothing for consumers when skip is set.
type binder struct {
	scopes []omnibus.HookScope
	bound  []*recorder
	order  []string
	skip   bool
}

func (b *binder) BindHook(s omnibus.HookScope) omnibus.Hook {
	b.scopes = append(b.scopes, s)
	if b.skip && s.Consumer != nil {
		return nil
	}
	r := newRecorder(fmt.Sprint(len(b.scopes)), &b.order)
	b.bound = append(b.bound, r)
	return r
}

// A HookBinder is bound once for the client and once per consumer, with
// the transport and the consumer, and what it binds is what runs; a nil
// binding is no hook.
func TestHookBinder(t *testing.T) {
	onClient, onConsumer, skipping := &binder{}, &binder{}, &binder{skip: true}
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 1}).Conn(), quiet(), omnibus.WithHooks(onClient, skipping))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(onClient.scopes) != 1 || onClient.scopes[0] != (omnibus.HookScope{Transport: "membus"}) {
		t.Fatalf("bound to %+v after New, want once, to the client (transport membus)", onClient.scopes)
	}
	handled := make(chan struct{}, 1)
	k, err := c.Subscribe(context.Background(), "bind", func(context.Context, *omnibus.Message) error {
		handled <- struct{}{}
		return nil
	}, omnibus.Hooks(onConsumer), omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, b := range []*binder{onClient, onConsumer, skipping} {
		last := b.scopes[len(b.scopes)-1]
		if last.Transport != "membus" || last.Consumer != k {
			t.Errorf("bound to %+v, want the consumer last", b.scopes)
		}
	}
	if err := c.Publish(context.Background(), "bind", &omnibus.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	<-handled
	waitFor(t, func() bool { return k.Stats().Processed == 1 }, "the message settled")
	clientBound, consumerBound := onClient.bound[0], onClient.bound[1]
	if len(clientBound.published) != 1 || len(consumerBound.published) != 0 {
		t.Errorf("publishes seen: client-bound %d, consumer-bound %d; want 1, 0", len(clientBound.published), len(consumerBound.published))
	}
	consumerBound.mu.Lock()
	if len(consumerBound.handled) != 1 || len(clientBound.handled) != 0 {
		t.Errorf("handlings seen: consumer-bound %d, client-bound %d; want 1, 0", len(consumerBound.handled), len(clientBound.handled))
	}
	consumerBound.mu.Unlock()
	if len(onConsumer.bound) != 1 || len(onConsumer.bound[0].handled) != 1 {
		t.Errorf("the consumer's own binder: %d bound, want 1 that saw the handling", len(onConsumer.bound))
	}
	if len(skipping.bound) != 1 { // the client's only: nil for the consumer
		t.Errorf("skipping binder bound %d hooks, want 1", len(skipping.bound))
	}
}
