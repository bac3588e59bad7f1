package promomnibus_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/promomnibus"
)

// Count what a consumer does, for Prometheus to scrape.
func Example() {
	ctx := context.Background()
	col := promomnibus.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(col) // in a program: serve it with promhttp.HandlerFor(reg, ...)

	c, err := omnibus.Open(ctx, "mem://example-prom?partitions=1", omnibus.WithHooks(col))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	done := make(chan struct{})
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		if m.Attempt == 1 && string(m.Body) == "flaky" {
			return fmt.Errorf("try again")
		}
		if string(m.Body) == "last" {
			close(done)
		}
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderLane))
	if err != nil {
		panic(err)
	}
	go k.Run(ctx)
	err = c.Publish(ctx, "orders", &omnibus.Message{Body: []byte("ok")}, &omnibus.Message{Body: []byte("flaky")}, &omnibus.Message{Body: []byte("last")})
	if err != nil {
		panic(err)
	}
	<-done
	if err := k.Shutdown(ctx); err != nil {
		panic(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "omnibus_published_messages_total", "omnibus_handled_messages_total", "omnibus_handler_errors_total", "omnibus_retries_total":
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// omnibus_handled_messages_total{group=billing,lane=0,topic=orders,transport=mem} 4
	// omnibus_handler_errors_total{group=billing,lane=0,topic=orders,transport=mem} 1
	// omnibus_published_messages_total{topic=orders,transport=mem} 3
	// omnibus_retries_total{group=billing,lane=0,topic=orders,transport=mem} 1
}
