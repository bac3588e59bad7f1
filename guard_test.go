package omnibus_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// countingConn wraps a membus connection as a transport with attempt
// counts across holders: attempt says what Attempt the first delivery of
// each Subscriber gets (the driver's claim record), and keeper, when set,
// makes the subscribers driver.AttemptKeepers.
type countingConn struct {
	driver.Conn
	attempt func(d *driver.Delivery) int
	keeper  *fakeKeeper
}

func (c countingConn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	s, err := c.Conn.Subscribe(ctx, topic, opts)
	if err != nil || strings.HasSuffix(topic, ".dlq") {
		return s, err
	}
	cs := &countingSub{Subscriber: s, c: c}
	if c.keeper != nil {
		return &keepingSub{cs}, nil
	}
	return cs, nil
}

type countingSub struct {
	driver.Subscriber
	c countingConn
}

func (s *countingSub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	ds, err := s.Subscriber.Receive(ctx, room)
	for _, d := range ds {
		d.Attempt = s.c.attempt(d)
	}
	return ds, err
}

func (s *countingSub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	if k := s.c.keeper; k != nil {
		for _, d := range ds {
			off, _ := strconv.Atoi(d.Position)
			k.committed.Store(int64(off + 1))
		}
	}
	return s.Subscriber.(driver.Committer).Commit(ctx, ds)
}

// keepingSub is a countingSub with Begin.
type keepingSub struct{ *countingSub }

func (s *keepingSub) Begin(ctx context.Context, d *driver.Delivery) (int, error) {
	return s.c.keeper.begin(d), nil
}

// fakeKeeper records Begin calls: the position begun, and whether the
// committed position was that position when Begin came.
type fakeKeeper struct {
	committed atomic.Int64
	mu        sync.Mutex
	begun     []string
	atCommit  []bool
	counts    map[string]int // holders that began a position before
}

func (k *fakeKeeper) begin(d *driver.Delivery) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	off, _ := strconv.Atoi(d.Position)
	k.begun = append(k.begun, d.Position)
	k.atCommit = append(k.atCommit, k.committed.Load() == int64(off))
	return k.counts[d.Position] + 1
}

func deadLetters(t *testing.T, c *omnibus.Client, topic string) func() map[string]map[string]string {
	t.Helper()
	var mu sync.Mutex
	dead := map[string]map[string]string{}
	k, err := c.Subscribe(context.Background(), topic+".dlq", func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		dead[m.ID] = m.Headers
		mu.Unlock()
		return nil
	}, omnibus.Group("dlq"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = k.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return func() map[string]map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]map[string]string{}
		for id, h := range dead {
			out[id] = h
		}
		return out
	}
}

// TestExhaustedOnArrival: a delivery whose transport count says it was
// delivered MaxAttempts times without being settled is dead-lettered
// without running the handler; the others run.
func TestExhaustedOnArrival(t *testing.T) {
	bus := membus.New(membus.Config{Partitions: 1})
	c, err := omnibus.New(countingConn{Conn: bus.Conn(), attempt: func(d *driver.Delivery) int {
		if d.ID == "poison" {
			return 4 // three holders took it and never settled it
		}
		return 1
	}}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead := deadLetters(t, c, "t")
	var mu sync.Mutex
	var ran []string
	k, err := c.Subscribe(context.Background(), "t", func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		ran = append(ran, m.ID)
		mu.Unlock()
		return nil
	}, omnibus.MaxAttempts(3), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(context.Background(), "t", &omnibus.Message{ID: "a"}, &omnibus.Message{ID: "poison"}, &omnibus.Message{ID: "b"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = k.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n >= 2 && dead()["poison"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ran %d, dead-lettered %v", n, dead())
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(ran, "poison") {
		t.Errorf("the handler ran the exhausted message: %v", ran)
	}
	h := dead()["poison"]
	if h[omnibus.HeaderDeadAttempts] != "3" || !strings.Contains(h[omnibus.HeaderDeadReason], "delivered 3 times") {
		t.Errorf("dead letter headers %v", h)
	}
}

// TestGuardedLane: on a transport that keeps attempts, a claim whose
// first delivery was begun before guards the lane: its messages run one
// at a time, each begun at the committed position, and one begun
// MaxAttempts times is dead-lettered without running.
func TestGuardedLane(t *testing.T) {
	bus := membus.New(membus.Config{Partitions: 1})
	keeper := &fakeKeeper{counts: map[string]int{"5": 3}} // the sixth message was begun 3 times
	var first atomic.Bool
	c, err := omnibus.New(countingConn{Conn: bus.Conn(), keeper: keeper, attempt: func(d *driver.Delivery) int {
		if first.CompareAndSwap(false, true) {
			return 2 // a previous holder began the claim's position
		}
		return 0
	}}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead := deadLetters(t, c, "t")
	ms := make([]*omnibus.Message, 20)
	for i := range ms {
		ms[i] = &omnibus.Message{ID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i%4)}
	}
	if err := c.Publish(context.Background(), "t", ms...); err != nil {
		t.Fatal(err)
	}
	var running, peak atomic.Int32
	var mu sync.Mutex
	var ran []string
	k, err := c.Subscribe(context.Background(), "t", func(_ context.Context, m *omnibus.Message) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		ran = append(ran, m.ID)
		mu.Unlock()
		return nil
	}, omnibus.MaxAttempts(3), omnibus.MaxInFlight(16), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = k.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n == 19 && dead()["m5"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ran %d, dead-lettered %v", n, dead())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p := peak.Load(); p != 1 {
		t.Errorf("%d handlers ran at once on a guarded lane, want 1", p)
	}
	keeper.mu.Lock()
	defer keeper.mu.Unlock()
	// The claim's head (position 0), begun by a previous holder, is a
	// suspect the driver did not record: it and every other message was
	// begun when it ran, at the committed position.
	if len(keeper.begun) != 20 || keeper.begun[0] != "0" {
		t.Errorf("Begin for positions %v, want 0..19", keeper.begun)
	}
	for i, ok := range keeper.atCommit {
		if !ok {
			t.Errorf("position %s begun before the lane was committed up to it", keeper.begun[i])
		}
	}
	if slices.Contains(ran, "m5") {
		t.Errorf("the message begun 3 times before ran again")
	}
}
