package autoscale_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	_ "github.com/omnibus-go/omnibus/kafkabus"
	"github.com/omnibus-go/omnibus/membus"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// recorder keeps the decisions a controller made.
type recorder struct {
	mu sync.Mutex
	ds []autoscale.Decision
}

func (r *recorder) add(d autoscale.Decision) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
}

func (r *recorder) actions() []autoscale.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []autoscale.Decision
	for _, d := range r.ds {
		if d.Action != "hold" {
			out = append(out, d)
		}
	}
	return out
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ScaleCase runs the backlog scenario on a client: 12 lanes, 50,000
// messages, a 2 ms handler, one message in flight per member, so members
// are what adds throughput. Transport packages call it too.
func runBacklogScenario(t *testing.T, c *omnibus.Client, topic string) {
	const n, lanes = 50_000, 12
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.CreateTopic(ctx, topic, lanes); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := make(map[string]bool, n)
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		seen[m.ID] = true
		mu.Unlock()
		return nil
	}, omnibus.Group("scaled"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(1), omnibus.Order(omnibus.OrderLane))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	var ids []string
	for i := 0; i < n; i += 1000 {
		var ms []*omnibus.Message
		for j := i; j < i+1000; j++ {
			ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(j), Body: []byte("x")})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	rec := &recorder{}
	ctl, err := autoscale.New(k, autoscale.Policy{
		TargetLag: 1000, Interval: 100 * time.Millisecond, UpCooldown: 300 * time.Millisecond,
		DownDelay: time.Second, StallAfter: 10, Logger: quiet(), OnDecision: rec.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	go ctl.Run(ctx)

	var peak atomic.Int64
	waitFor(t, 90*time.Second, func() bool {
		peak.Store(max(peak.Load(), int64(k.Members())))
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, "the backlog to drain")
	waitFor(t, 30*time.Second, func() bool { return k.Members() == 1 }, "scaling back to the minimum")

	mu.Lock()
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("message %s lost", id)
		}
	}
	mu.Unlock()
	acts := rec.actions()
	if peak.Load() != lanes {
		t.Errorf("peak members %d, want the lane cap %d", peak.Load(), lanes)
	}
	// The bound held: at most 2 steps up, then only steps down (no
	// oscillation), at most 12 changes in all.
	ups, downs := 0, 0
	for _, d := range acts {
		switch d.Action {
		case "up":
			ups++
			if downs > 0 {
				t.Errorf("scaled up after scaling down: %+v", acts)
			}
		case "down":
			downs++
		}
		if d.Desired > lanes {
			t.Errorf("desired %d above the lane cap", d.Desired)
		}
	}
	if ups == 0 || ups > 2 || downs == 0 || len(acts) > 12 {
		t.Errorf("%d ups and %d downs (%d changes); want 1-2 ups, at least one down, at most 12 changes", ups, downs, len(acts))
	}
	for _, d := range acts {
		t.Logf("%s %d -> %d: %s", d.Action, d.Current, d.Desired, d.Reason)
	}
}

func TestBacklogMembus(t *testing.T) {
	c, err := omnibus.New(membus.New(membus.Config{}).Conn(), omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runBacklogScenario(t, c, "backlog")
}

// A lane whose head keeps failing builds lag without progress; the
// controller must not add members for it.
func TestStalledLaneDoesNotScaleUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 4}).Conn(), omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "stall", func(ctx context.Context, m *omnibus.Message) error {
		if m.Key == "poison" {
			return errors.New("always fails")
		}
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxAttempts(1_000_000), omnibus.Backoff(5*time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	go k.Run(ctx)
	rec := &recorder{}
	ctl, err := autoscale.New(k, autoscale.Policy{TargetLag: 150, Interval: 50 * time.Millisecond, UpCooldown: time.Millisecond, Logger: quiet(), OnDecision: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	go ctl.Run(ctx)
	// The poison message first, then a steady flow: the poison lane's lag
	// grows past the target while its watermark cannot move.
	if err := c.Publish(ctx, "stall", &omnibus.Message{Key: "poison"}); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		var ms []*omnibus.Message
		for j := range 25 {
			ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i*25+j)})
		}
		if err := c.Publish(ctx, "stall", ms...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.ds) > 0 && len(rec.ds[len(rec.ds)-1].Stalled) == 1
	}, "the poison lane to be seen as stalled")
	rec.mu.Lock()
	last := rec.ds[len(rec.ds)-1]
	rec.mu.Unlock()
	for _, l := range last.Lanes {
		if l.Stalled && l.Lag <= 150 {
			t.Fatalf("the stalled lane's lag %d is not above the target: the test proves nothing", l.Lag)
		}
	}
	if acts := rec.actions(); len(acts) > 0 || k.Members() != 1 {
		t.Errorf("scaled for a stalled lane: members %d, actions %+v", k.Members(), acts)
	}
}

// failingLag is a target whose lag cannot be read.
type failingLag struct {
	*omnibus.Consumer
	unknown bool
}

func (f failingLag) Lag(ctx context.Context) ([]omnibus.LaneLag, error) {
	if f.unknown {
		return []omnibus.LaneLag{{Lane: "0", Known: false}, {Lane: "1", Lag: 1e6, Known: true}}, nil
	}
	return nil, errors.New("broker unreachable")
}

func TestUnknownLagHolds(t *testing.T) {
	ctx := context.Background()
	c, err := omnibus.New(membus.New(membus.Config{}).Conn(), omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "t", func(context.Context, *omnibus.Message) error { return nil }, omnibus.Members(3))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, unknown := range []bool{false, true} {
		rec := &recorder{}
		ctl, err := autoscale.New(failingLag{k, unknown}, autoscale.Policy{TargetLag: 1, Min: 1, DownDelay: time.Nanosecond, UpCooldown: time.Nanosecond, Logger: quiet(), OnDecision: rec.add})
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if err := ctl.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if k.Members() != 3 || len(rec.actions()) != 0 {
			t.Errorf("unknown=%v: members %d, actions %+v; want 3 held", unknown, k.Members(), rec.actions())
		}
		if r := rec.ds[0].Reason; r == "" {
			t.Error("a hold without a reason")
		}
	}
}

func TestPolicyValidation(t *testing.T) {
	c, _ := omnibus.New(membus.New(membus.Config{}).Conn())
	defer c.Close()
	k, err := c.Subscribe(context.Background(), "t", func(context.Context, *omnibus.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, p := range []autoscale.Policy{
		{},
		{TargetLag: -1},
		{TargetLag: 1, Min: 5, Max: 2},
		{TargetLag: 1, Interval: -time.Second},
		{TargetLag: 1, Min: -1},
	} {
		if _, err := autoscale.New(k, p); !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("New(%+v): got %v, want ErrInvalid", p, err)
		}
	}
	if _, err := autoscale.New(nil, autoscale.Policy{TargetLag: 1}); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("nil target: %v", err)
	}
}

func TestBacklogKafka(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",") + "?fetch_max_wait=50ms"
	c, err := omnibus.Open(ctx, url, omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runBacklogScenario(t, c, "backlog")
}
