package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func TestClassify(t *testing.T) {
	p := func(lag int64) lagPoint { return lagPoint{Lag: lag, Known: true, Committed: -1, Members: -1} }
	pc := func(lag, committed int64) lagPoint {
		return lagPoint{Lag: lag, Known: true, Committed: committed, Members: -1}
	}
	unknown := lagPoint{Committed: -1, Members: -1}
	stopped := func(lag int64) lagPoint { return lagPoint{Lag: lag, Known: true, Committed: -1, Members: 0} }
	tests := []struct {
		name   string
		window []lagPoint
		want   laneStatus
	}{
		{"empty", nil, statusUnknown},
		{"latest unknown", []lagPoint{p(0), p(3), unknown}, statusUnknown},
		{"one sample, no lag", []lagPoint{p(0)}, statusOK},
		{"one sample with lag: too early", []lagPoint{p(50)}, statusEarly},
		{"one sample with lag, no members", []lagPoint{stopped(50)}, statusStop},
		{"caught up in the window", []lagPoint{p(10), p(0), p(10)}, statusOK},
		{"falling", []lagPoint{p(30), p(20), p(10)}, statusOK},
		{"unknown samples skipped", []lagPoint{p(30), unknown, p(10)}, statusOK},
		{"growing while consuming", []lagPoint{p(10), p(8), p(15), p(20)}, statusWarn},
		{"growing, progress unknown", []lagPoint{p(10), p(20), p(30)}, statusWarn},
		{"stuck", []lagPoint{p(12), p(12), p(12)}, statusStall},
		{"committed moving, lag growing", []lagPoint{pc(10, 100), pc(15, 120), pc(20, 140)}, statusWarn},
		{"committed moving, lag held", []lagPoint{pc(10, 100), pc(10, 120)}, statusWarn},
		{"committed moving, lag falling", []lagPoint{pc(10, 100), pc(5, 120)}, statusOK},
		{"committed still, lag growing", []lagPoint{pc(10, 100), pc(15, 100), pc(30, 100)}, statusStall},
		{"committed still, lag held", []lagPoint{pc(10, 100), pc(10, 100)}, statusStall},
		{"no members left", []lagPoint{p(10), stopped(12)}, statusStop},
		{"no members but caught up", []lagPoint{stopped(0), stopped(0)}, statusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(tt.window); got != tt.want {
				t.Errorf("classify(%+v) = %s, want %s", tt.window, got, tt.want)
			}
		})
	}
}

func TestWorst(t *testing.T) {
	if got := worst(statusOK, statusStall, statusWarn); got != statusStall {
		t.Errorf("worst = %s, want STALL", got)
	}
	if got := worst(); got != statusOK {
		t.Errorf("worst() = %s, want OK", got)
	}
}

// TestLagMem reads a real group's lag on membus from outside the group:
// 30 messages published, none consumed, is a total of 30; a group that
// does not exist is a one-line error.
func TestLagMem(t *testing.T) {
	raw, c := memURL(t, "?partitions=3")
	ctx := ctxT(t)
	k, err := c.Subscribe(ctx, "orders", func(context.Context, *omnibus.Message) error { return nil },
		omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for i := range 30 {
		if err := c.Publish(ctx, "orders", &omnibus.Message{Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	r := runCmd(t, ctx, nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "g", "--json")
	wantCode(t, r, 0)
	var rep struct {
		Total int64 `json:"total"`
		Lanes []struct {
			Lane string `json:"lane"`
		} `json:"lanes"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &rep); err != nil {
		t.Fatalf("lag --json output %q: %v", r.stdout, err)
	}
	if rep.Total != 30 || len(rep.Lanes) != 3 {
		t.Errorf("lag total %d over %d lanes, want 30 over 3", rep.Total, len(rep.Lanes))
	}
	r = runCmd(t, ctx, nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "missing")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "not found", "")
}

// stuckGroup publishes to a 2-lane membus topic a group "billing" is
// reading, whose handler never finishes on lane 1: lane 0 catches up, lane
// 1 keeps its lag without progress.
func stuckGroup(t *testing.T) string {
	t.Helper()
	raw, c := memURL(t, "?partitions=2")
	ctx := ctxT(t)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		if m.Lane == "1" {
			select {
			case <-stuck:
			case <-ctx.Done():
			}
		}
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderLane))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	go k.Run(ctx)
	var ms []*omnibus.Message
	for i := range 40 {
		ms = append(ms, &omnibus.Message{Key: fmt.Sprint(i)})
	}
	if err := c.Publish(ctx, "orders", ms...); err != nil {
		t.Fatal(err)
	}
	waitLag(t, c, func(lags []omnibus.LaneLag) bool { return lags[0].Lag == 0 && lags[1].Lag > 0 })
	return raw
}

func waitLag(t *testing.T, c *omnibus.Client, cond func([]omnibus.LaneLag) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lags, err := c.Lag(ctxT(t), "orders", "billing")
		if err == nil && cond(lags) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag %v (%v) never reached the state the test needs", lags, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLagJSON(t *testing.T) {
	raw := stuckGroup(t)
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "billing", "--json", "--interval", "10ms")
	wantCode(t, r, exitOK)
	var rep lagReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("output %q is not one JSON object: %v", r.stdout, err)
	}
	if len(rep.Lanes) != 2 || rep.Lanes[0].Status != statusOK || rep.Lanes[0].Lag != 0 ||
		rep.Lanes[1].Status != statusStall || rep.Lanes[1].Lag == 0 || !rep.Lanes[1].Known {
		t.Fatalf("lanes %+v, want lane 0 OK at 0 and lane 1 STALL with lag", rep.Lanes)
	}
	if rep.Total != rep.Lanes[1].Lag || rep.Status != statusStall || rep.Topic != "orders" || rep.Group != "billing" {
		t.Errorf("report %+v: want the stuck lane's lag as the total, status STALL", rep)
	}
	for _, f := range []string{`"lanes":`, `"total":`, `"status":`, `"lag":`, `"known":`} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("JSON %s lacks %s", r.stdout, f)
		}
	}
}

func TestLagText(t *testing.T) {
	raw := stuckGroup(t)
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "billing", "--samples", "2", "--interval", "10ms")
	wantCode(t, r, exitOK)
	for _, want := range []string{"LANE", "LAG", "STATUS", "STALL", "OK", "total", "group billing"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestLagWatch(t *testing.T) {
	raw, c := memURL(t, "?partitions=2")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	release := make(chan struct{})
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		<-release
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	go k.Run(ctx)
	for i := range 20 {
		if err := c.Publish(ctx, "orders", &omnibus.Message{Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	time.AfterFunc(150*time.Millisecond, func() { close(release) })
	time.AfterFunc(600*time.Millisecond, cancel)
	r := runCmd(t, ctx, nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "billing", "--watch", "--json", "--interval", "50ms")
	wantCode(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) < 3 {
		t.Fatalf("--watch printed %d reports in 600ms at 50ms, want several:\n%s", len(lines), r.stdout)
	}
	var first, last lagReport
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if first.Total != 20 || last.Total != 0 || last.Status != statusOK {
		t.Errorf("first report total %d, last %+v; want 20 first, then caught up", first.Total, last)
	}
}
