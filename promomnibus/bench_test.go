package promomnibus_test

import (
	"context"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/membus"
	"github.com/omnibus-go/omnibus/promomnibus"
)

// BenchmarkCollectorHook is the collector's own work for one handled
// message, as the engine calls it (a fetch of one, a settle), without
// the engine around it: BenchmarkHooks in the root package shows it in
// a running consumer, where the machine's noise is larger than this.
func BenchmarkCollectorHook(b *testing.B) {
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 4}).Conn())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(context.Background(), "bench", func(context.Context, *omnibus.Message) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	h := promomnibus.New().BindHook(omnibus.HookScope{Transport: "mem", Consumer: k})
	fetch, settle := h.(omnibus.FetchHook), h.(omnibus.SettleHook)
	lanes := []string{"0", "1", "2", "3"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		fetch.OnFetch(omnibus.FetchInfo{Topic: "bench", Group: k.Group(), Count: 1, Bytes: 100})
		settle.OnSettle(omnibus.Event{Kind: omnibus.EventProcessed, Lane: lanes[i%4], Latency: time.Millisecond})
	}
}
