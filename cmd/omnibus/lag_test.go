package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
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
		{"one sample with lag: too early", []lagPoint{p(50)}, statusOK},
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

// lagtest is a transport whose group lag follows a script, one entry per
// read: it stands for a transport that reads a group's lag from outside.
type lagtest struct{}

type lagScript struct {
	mu      sync.Mutex
	reads   int
	lags    [][]int64 // per read, per lane; -1: unknown
	members []int
}

var (
	scriptsMu sync.Mutex
	scripts   = map[string]*lagScript{}
)

func (lagtest) Open(_ context.Context, u *url.URL) (driver.Conn, error) {
	scriptsMu.Lock()
	defer scriptsMu.Unlock()
	s := scripts[u.Host]
	if s == nil {
		return nil, driver.ErrNotFound
	}
	return &lagConn{s: s}, nil
}

type lagConn struct{ s *lagScript }

func (c *lagConn) Capabilities() driver.Capabilities {
	return driver.Capabilities{Lag: driver.LagRecords}
}
func (c *lagConn) Publish(context.Context, string, []*driver.Message, driver.PublishOptions) error {
	return driver.ErrUnsupported
}
func (c *lagConn) Subscribe(context.Context, string, driver.SubscribeOptions) (driver.Subscriber, error) {
	return nil, driver.ErrUnsupported
}
func (c *lagConn) Close() error { return nil }

func (c *lagConn) GroupLag(_ context.Context, topic, group string) ([]driver.LaneLag, error) {
	if group == "missing" {
		return nil, driver.ErrNotFound
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	row := c.s.lags[min(c.s.reads, len(c.s.lags)-1)]
	c.s.reads++
	lags := make([]driver.LaneLag, len(row))
	for i, v := range row {
		lags[i] = driver.LaneLag{Lane: string(rune('0' + i)), Lag: max(v, 0), Known: v >= 0}
	}
	return lags, nil
}

func (c *lagConn) GroupMembers(context.Context, string, string) (int, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.members[min(c.s.reads-1, len(c.s.members)-1)], nil
}

func init() { omnibus.Register("lagtest", lagtest{}) }

func script(t testing.TB, s *lagScript) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	scriptsMu.Lock()
	scripts[name] = s
	scriptsMu.Unlock()
	t.Cleanup(func() {
		scriptsMu.Lock()
		delete(scripts, name)
		scriptsMu.Unlock()
	})
	return "lagtest://" + name
}

func TestLagJSON(t *testing.T) {
	// Lane 0 catches up, lane 1 is stuck, lane 2 falls behind while
	// consuming, lane 3 cannot be read.
	raw := script(t, &lagScript{members: []int{2}, lags: [][]int64{
		{10, 7, 5, -1},
		{4, 7, 3, -1},
		{0, 7, 9, -1},
	}})
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "billing", "--json", "--interval", "10ms")
	wantCode(t, r, exitOK)
	var rep lagReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("output %q is not one JSON object: %v", r.stdout, err)
	}
	want := []laneReport{
		{Lane: "0", Lag: 0, Known: true, Status: statusOK},
		{Lane: "1", Lag: 7, Known: true, Status: statusStall},
		{Lane: "2", Lag: 9, Known: true, Status: statusWarn},
		{Lane: "3", Lag: 0, Known: false, Status: statusUnknown},
	}
	if len(rep.Lanes) != len(want) {
		t.Fatalf("lanes %+v, want %+v", rep.Lanes, want)
	}
	for i := range want {
		if rep.Lanes[i] != want[i] {
			t.Errorf("lane %d = %+v, want %+v", i, rep.Lanes[i], want[i])
		}
	}
	if rep.Total != 16 || rep.Unknown != 1 || rep.Status != statusStall || rep.Topic != "orders" || rep.Group != "billing" {
		t.Errorf("report %+v: want total 16, 1 unknown lane, status STALL", rep)
	}
	for _, f := range []string{`"lanes":`, `"total":`, `"status":`, `"lag":`, `"known":`} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("JSON %s lacks %s", r.stdout, f)
		}
	}
}

func TestLagText(t *testing.T) {
	raw := script(t, &lagScript{members: []int{1, 0}, lags: [][]int64{{5, 0}, {6, 0}}})
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "orders", "--group", "billing", "--samples", "2", "--interval", "10ms")
	wantCode(t, r, exitOK)
	for _, want := range []string{"LANE", "LAG", "STATUS", "STOP", "total", "group billing"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestLagWatch(t *testing.T) {
	raw := script(t, &lagScript{members: []int{1}, lags: [][]int64{{3}, {2}, {1}, {0}}})
	ctx, cancel := context.WithCancel(ctxT(t))
	time.AfterFunc(300*time.Millisecond, cancel)
	r := runCmd(t, ctx, nil, "", "lag", "--url", raw, "--topic", "t", "--group", "g", "--watch", "--json", "--interval", "50ms")
	wantCode(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) < 3 {
		t.Fatalf("--watch printed %d reports in 300ms at 50ms, want several:\n%s", len(lines), r.stdout)
	}
	var last lagReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Total != 0 || last.Status != statusOK {
		t.Errorf("last report %+v, want caught up", last)
	}
}

func TestLagGroupNotFound(t *testing.T) {
	raw := script(t, &lagScript{members: []int{1}, lags: [][]int64{{1}}})
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "t", "--group", "missing", "--interval", "10ms")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "not found", "")
}
