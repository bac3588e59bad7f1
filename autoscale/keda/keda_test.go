package keda_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/autoscale/keda"
	pb "github.com/omnibus-go/omnibus/internal/externalscaler"
	"github.com/omnibus-go/omnibus/membus"
)

// TestKEDAAsKEDACallsIt: a client generated from KEDA's proto calls the
// scaler as KEDA does while a one-member group works off a backlog of
// 6,000 messages on 12 lanes with a target of 500 per member: the metric
// asks for the lag's 12 members while the backlog is there, falls as the
// lag falls, and ends at 1; the group is active until the lag is gone,
// and the stream says so when it changes.
func TestKEDAAsKEDACallsIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 12}).Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, target = 6000, 500
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(time.Millisecond)
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(4))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	var ms []*omnibus.Message
	for i := range n {
		ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")})
	}
	if err := c.Publish(ctx, "orders", ms...); err != nil {
		t.Fatal(err)
	}

	ctl, err := autoscale.NewGroup(c, "orders", "billing", autoscale.Policy{
		TargetLag: target, Interval: 20 * time.Millisecond, UpCooldown: time.Millisecond,
		DownDelay: 100 * time.Millisecond, StallAfter: 10, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctl.Run(ctx) }()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	serveCtx, stop := context.WithCancel(ctx)
	go func() {
		served <- keda.Serve(serveCtx, lis, keda.Group{Topic: "orders", Group: "billing", Controller: ctl})
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	scaler := pb.NewExternalScalerClient(conn)
	ref := &pb.ScaledObjectRef{Name: "billing", Namespace: "shop", ScalerMetadata: map[string]string{"topic": "orders", "group": "billing"}}

	spec, err := scaler.GetMetricSpec(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.MetricSpecs) != 1 || spec.MetricSpecs[0].MetricName != "omnibus-orders-billing" || spec.MetricSpecs[0].TargetSizeFloat != 1 {
		t.Fatalf("GetMetricSpec: %v, want omnibus-orders-billing with target 1", spec)
	}
	metric := func() (int64, error) {
		r, err := scaler.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: spec.MetricSpecs[0].MetricName})
		if err != nil {
			return 0, err
		}
		if len(r.MetricValues) != 1 || r.MetricValues[0].MetricName != "omnibus-orders-billing" || float64(r.MetricValues[0].MetricValue) != r.MetricValues[0].MetricValueFloat {
			t.Fatalf("GetMetrics: %v", r)
		}
		return r.MetricValues[0].MetricValue, nil
	}

	// The stream, as KEDA keeps it open.
	var mu sync.Mutex
	var actives []bool
	stream, err := scaler.StreamIsActive(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			actives = append(actives, r.Result)
			mu.Unlock()
		}
	}()

	// Nothing consumed yet: no lane progresses, so the lag asks for no
	// more than the one member there is; the group has work.
	waitFor(t, func() bool { v, err := metric(); return err == nil && v == 1 }, "a first metric of 1")
	if r, err := scaler.IsActive(ctx, ref); err != nil || !r.Result {
		t.Fatalf("IsActive with a backlog: %v, %v", r, err)
	}
	go func() { _ = k.Run(ctx) }()

	// While it drains: the metric with the lag behind it.
	type sample struct {
		metric int64
		lag    int64
	}
	var samples []sample
	for {
		v, err := metric()
		if err != nil {
			t.Fatal(err)
		}
		lags, err := c.Lag(ctx, "orders", "billing")
		if err != nil {
			t.Fatal(err)
		}
		var lag int64
		for _, l := range lags {
			lag += l.Lag
		}
		samples = append(samples, sample{v, lag})
		if lag == 0 && v == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("never back to 1 member with no lag; samples %v", samples)
		}
		time.Sleep(10 * time.Millisecond)
	}
	peak := 0
	for i, s := range samples {
		if s.metric > samples[peak].metric {
			peak = i
		}
		// Never more than the lag asks for (the lag read after the
		// metric is at most the one behind it).
		if want := (s.lag + target - 1) / target; s.metric > max(want, 1) && i > 0 && s.metric > samples[i-1].metric {
			t.Errorf("sample %d: metric rose to %d with lag %d (asks for %d)", i, s.metric, s.lag, want)
		}
	}
	if samples[peak].metric != 12 {
		t.Errorf("peak metric %d, want 12 (lag %d over %d per member, 12 lanes)", samples[peak].metric, n, target)
	}
	falls := 0
	for i := peak + 1; i < len(samples); i++ {
		if samples[i].metric > samples[i-1].metric {
			t.Errorf("the metric rose from %d to %d after its peak, while the lag fell to %d", samples[i-1].metric, samples[i].metric, samples[i].lag)
		}
		if samples[i].metric < samples[i-1].metric {
			falls++
		}
	}
	if falls < 2 {
		t.Errorf("the metric fell in %d steps from its peak, want it to follow the lag down", falls)
	}
	t.Logf("%d samples, peak %d at lag %d, %d steps down", len(samples), samples[peak].metric, samples[peak].lag, falls)

	waitFor(t, func() bool {
		r, err := scaler.IsActive(ctx, ref)
		return err == nil && !r.Result
	}, "IsActive false with no lag")
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(actives) >= 2 && actives[0] && !actives[len(actives)-1]
	}, "the stream to say active, then not")
	mu.Lock()
	for i := 1; i < len(actives); i++ {
		if actives[i] == actives[i-1] {
			t.Errorf("the stream repeated %v: %v", actives[i], actives)
		}
	}
	mu.Unlock()

	// What a wrong ScaledObject gets.
	for _, md := range []map[string]string{
		{"topic": "orders", "group": "shipping"},
		{"topic": "orders", "group": "billing", "membersPerReplica": "0"},
	} {
		_, err := scaler.GetMetricSpec(ctx, &pb.ScaledObjectRef{Name: "x", ScalerMetadata: md})
		if code := status.Code(err); code != codes.NotFound && code != codes.InvalidArgument {
			t.Errorf("GetMetricSpec(%v): %v, want NotFound or InvalidArgument", md, err)
		}
	}
	if r, err := scaler.GetMetricSpec(ctx, &pb.ScaledObjectRef{ScalerMetadata: map[string]string{"membersPerReplica": "4"}}); err != nil || r.MetricSpecs[0].TargetSize != 4 {
		t.Errorf("GetMetricSpec with membersPerReplica 4 and the one group: %v, %v", r, err)
	}
}

func TestNewServerRefusesBadGroups(t *testing.T) {
	c, err := omnibus.New(membus.New(membus.Config{}).Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctl, err := autoscale.NewGroup(c, "t", "g", autoscale.Policy{TargetLag: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, gs := range [][]keda.Group{
		nil,
		{{Topic: "t", Group: "g"}},
		{{Topic: "t", Controller: ctl}},
		{{Topic: "t", Group: "g", Controller: ctl, MembersPerReplica: -1}},
		{{Topic: "t", Group: "g", Controller: ctl}, {Topic: "t", Group: "g", Controller: ctl}},
	} {
		if _, err := keda.NewServer(gs...); !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("NewServer(%+v): %v, want ErrInvalid", gs, err)
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
