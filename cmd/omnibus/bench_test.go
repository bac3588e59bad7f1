package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func benchJSON(t testing.TB, r result) map[string]any {
	t.Helper()
	wantCode(t, r, exitOK)
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("output %q is not one JSON object: %v", r.stdout, err)
	}
	for _, f := range []string{"transport", "size", "count", "publish_msgs_per_s", "async_publish_msgs_per_s", "consume_msgs_per_s", "p50_ms", "p99_ms"} {
		if _, ok := m[f]; !ok {
			t.Errorf("JSON lacks %q: %s", f, r.stdout)
		}
	}
	return m
}

func TestBenchMemJSON(t *testing.T) {
	raw, _ := memURL(t, "")
	m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "500", "--size", "64", "--json"))
	if m["transport"] != "mem" || m["count"] != 500.0 || m["size"] != 64.0 {
		t.Errorf("JSON %v: want transport mem, count 500, size 64", m)
	}
	if m["publish_msgs_per_s"].(float64) <= 0 || m["async_publish_msgs_per_s"].(float64) <= 0 || m["consume_msgs_per_s"].(float64) <= 0 || m["p99_ms"].(float64) < m["p50_ms"].(float64) {
		t.Errorf("implausible numbers: %v", m)
	}
	if _, ok := m["raw_publish_msgs_per_s"]; ok {
		t.Errorf("mem has no raw client, but JSON has raw_*: %v", m)
	}
	if m["no_baseline"] == "" {
		t.Errorf("JSON does not say why there is no baseline: %v", m)
	}
}

func TestBenchText(t *testing.T) {
	raw, _ := memURL(t, "")
	r := runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "200")
	wantCode(t, r, exitOK)
	for _, want := range []string{"publish", "consume", "p50", "p99", "no baseline"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestBenchBaseline(t *testing.T) {
	raw, _ := memURL(t, "")
	baselines["mem"] = baseline{client: "fake", run: func(ctx context.Context, c *omnibus.Client, rawURL, topic string, o benchOptions, _ *leftovers) (float64, float64, error) {
		if c == nil || rawURL != raw || o.count != 100 {
			t.Errorf("baseline got client %v, url %q, count %d", c, rawURL, o.count)
		}
		return 1000, 2000, nil
	}}
	t.Cleanup(func() { delete(baselines, "mem") })
	m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "100", "--json"))
	if m["raw_publish_msgs_per_s"] != 1000.0 || m["raw_consume_msgs_per_s"] != 2000.0 || m["baseline"] != "fake" {
		t.Errorf("JSON %v: want the baseline's rates", m)
	}
	if _, ok := m["publish_ratio"]; !ok {
		t.Errorf("JSON %v lacks publish_ratio", m)
	}
	r := runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "100")
	if !strings.Contains(r.stdout, "omnibus / raw") {
		t.Errorf("text output lacks the ratio:\n%s", r.stdout)
	}
}

func TestBenchEmbeddedDefault(t *testing.T) {
	m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--count", "300", "--json"))
	if m["transport"] != scheme(defaultURL()) {
		t.Errorf("transport %v, want the default's %q", m["transport"], scheme(defaultURL()))
	}
	if _, ok := baselines[scheme(defaultURL())]; ok {
		if _, ok := m["raw_publish_msgs_per_s"]; !ok {
			t.Errorf("the default transport has a raw baseline, but JSON lacks raw_publish_msgs_per_s: %v", m)
		}
		if _, ok := m["consume_ratio"]; !ok {
			t.Errorf("JSON lacks consume_ratio: %v", m)
		}
	}
}

func TestBenchInterrupted(t *testing.T) {
	raw, _ := memURL(t, "")
	ctx, cancel := context.WithCancel(ctxT(t))
	time.AfterFunc(300*time.Millisecond, cancel)
	r := runCmd(t, ctx, nil, "", "bench", "--url", raw, "--count", "100000000", "--batch", "10")
	wantCode(t, r, exitInterrupted)
	if r.took > 10*time.Second {
		t.Errorf("bench took %v to stop after Ctrl-C", r.took)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(ds, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(ds, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
}
