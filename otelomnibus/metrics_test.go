package otelomnibus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/otelomnibus"
)

// The hook's metrics after observetest's workload: 13 messages published
// in two Publish calls; of the 10 first, one fails once (a retry), one is
// permanent (a dead letter); the last 3 are held by the handler, so the
// gauges show them in flight and in the lag while the consumer runs.
func TestMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	hook, err := otelomnibus.New(otelomnibus.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	ns := observetest.Namespace()
	c := observetest.Open(t, "mem://"+ns+"?partitions=2&max_bytes=4096", omnibus.WithHooks(hook))
	topic, group := "orders", "billing"
	w := observetest.StartWorkload(t, ctx, c, topic, group)
	// One Publish that lands one message and refuses one (too large).
	if err := c.Publish(ctx, "elsewhere", &omnibus.Message{Body: []byte("x")}, &omnibus.Message{Body: make([]byte, 8192)}); !errors.Is(err, omnibus.ErrTooLarge) {
		t.Fatalf("publish of an oversized message: %v, want ErrTooLarge", err)
	}
	k := w.Consumer
	var rm metricdata.ResourceMetrics
	observetest.Eventually(t, 10*time.Second, func() error {
		if err := reader.Collect(ctx, &rm); err != nil {
			return err
		}
		if n := gaugeSum(rm, "omnibus.consumer.in_flight"); n != 3 {
			return fmt.Errorf("%d in flight, want the 3 held", n)
		}
		if n := gaugeSum(rm, "omnibus.consumer.lag"); n != 3 { // once the 10 settled are committed
			return fmt.Errorf("lag %d, want the 3 held", n)
		}
		return nil
	})
	base := attribute.NewSet(attribute.String("messaging.system", "membus"), attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.consumer.group.name", group))
	checks := []struct {
		name string
		got  int64
		want func(int64) bool
		says string
	}{
		{"messaging.client.sent.messages", counterSum(rm, "messaging.client.sent.messages"), eq(15), "15: 13 and the 2 of the refused Publish"},
		{"messaging.client.operation.duration (count)", histCount(rm, "messaging.client.operation.duration"), eq(3), "3 publishes"},
		// 10 + a second attempt + the 3 held, which are handled (not yet returned): counted at the end
		{"messaging.client.consumed.messages", counterSum(rm, "messaging.client.consumed.messages"), eq(11), "11 handler calls returned"},
		{"messaging.process.duration (count)", histCount(rm, "messaging.process.duration"), eq(11), "11"},
		{"omnibus.consumer.retries", counterSum(rm, "omnibus.consumer.retries"), eq(1), "1"},
		{"omnibus.consumer.dead_letters", counterSum(rm, "omnibus.consumer.dead_letters"), eq(1), "1"},
		{"omnibus.consumer.lane_changes", counterSum(rm, "omnibus.consumer.lane_changes"), eq(2), "2 lanes claimed"},
		{"omnibus.consumer.members", gaugeSum(rm, "omnibus.consumer.members"), eq(1), "1"},
	}
	for _, c := range checks {
		if !c.want(c.got) {
			t.Errorf("%s = %d, want %s", c.name, c.got, c.says)
		}
	}
	// Every point of the consumer's metrics names the system, the topic
	// and the group; those of a lane name the lane (partition id).
	for _, name := range []string{"messaging.process.duration", "omnibus.consumer.lag", "omnibus.consumer.in_flight", "omnibus.consumer.retries"} {
		for _, attrs := range points(rm, name) {
			for _, kv := range base.ToSlice() {
				if v, ok := attrs.Value(kv.Key); !ok || v != kv.Value {
					t.Errorf("%s point %v: %s = %v, want %v", name, attrs.ToSlice(), kv.Key, v.String(), kv.Value.String())
				}
			}
			if v, ok := attrs.Value("messaging.destination.partition.id"); !ok || (v.AsString() != "0" && v.AsString() != "1") {
				t.Errorf("%s point %v: no lane", name, attrs.ToSlice())
			}
		}
	}
	var refused int64
	d, _ := find(rm, "messaging.client.sent.messages")
	for _, p := range d.(metricdata.Sum[int64]).DataPoints {
		if _, ok := p.Attributes.Value("error.type"); ok {
			refused += p.Value
		}
	}
	if refused != 1 {
		t.Errorf("messaging.client.sent.messages with error.type: %d, want the 1 refused", refused)
	}
	failed := 0
	for _, attrs := range points(rm, "messaging.process.duration") {
		if v, ok := attrs.Value("error.type"); ok {
			failed++
			if !strings.Contains(v.AsString(), "errors") && !strings.Contains(v.AsString(), "omnibus") {
				t.Errorf("error.type %q, want the error's type", v.AsString())
			}
		}
	}
	if failed == 0 {
		t.Errorf("no messaging.process.duration point with error.type, want the failed handlings'")
	}
	w.Release()
	if err := k.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if n := len(points(rm, "omnibus.consumer.members")); n != 0 {
		t.Errorf("a stopped consumer still has %d members points", n)
	}
	if err := hook.Close(); err != nil {
		t.Fatal(err)
	}
}

func eq(n int64) func(int64) bool { return func(v int64) bool { return v == n } }

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Aggregation, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data, true
			}
		}
	}
	return nil, false
}

func counterSum(rm metricdata.ResourceMetrics, name string) int64 {
	d, _ := find(rm, name)
	s, _ := d.(metricdata.Sum[int64])
	var n int64
	for _, p := range s.DataPoints {
		n += p.Value
	}
	return n
}

func gaugeSum(rm metricdata.ResourceMetrics, name string) int64 {
	d, _ := find(rm, name)
	g, _ := d.(metricdata.Gauge[int64])
	var n int64
	for _, p := range g.DataPoints {
		n += p.Value
	}
	return n
}

func histCount(rm metricdata.ResourceMetrics, name string) int64 {
	d, _ := find(rm, name)
	h, _ := d.(metricdata.Histogram[float64])
	var n uint64
	for _, p := range h.DataPoints {
		n += p.Count
	}
	return int64(n)
}

// points returns the attributes of every data point of name.
func points(rm metricdata.ResourceMetrics, name string) []attribute.Set {
	d, _ := find(rm, name)
	var out []attribute.Set
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}
