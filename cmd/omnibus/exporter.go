package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/promomnibus"
)

type exporterOptions struct {
	url         string
	topic       string
	groups      []string
	metricsAddr string
}

func (a *app) exporterCmd() *cobra.Command {
	var o exporterOptions
	cmd := &cobra.Command{
		Use:   "exporter --topic T --group G [--group G2 ...] [--metrics-addr ADDR]",
		Short: "Serve consumer groups' lag to Prometheus, without consuming",
		Long: `exporter serves the lag of consumer groups of a topic for Prometheus at
http://ADDR/metrics until Ctrl-C, reading it from the transport at every
scrape, without joining the groups (it takes no lanes and no messages
from their members). It works on every transport that lag works on.

Families (labels transport, topic, group, and lane where per lane):
  omnibus_lag_messages           the group's lag per lane; absent when unknown, never 0
  omnibus_lag_seconds            age of the lane's oldest unsettled message, where the transport tells
  omnibus_lag_unknown_lanes      lanes whose lag could not be read
  omnibus_lag_read_errors_total  reads that failed (a missing topic or group, a server down)
  omnibus_group_members          the group's members, where the transport tells

A read that fails is counted and the exporter goes on serving. The
consumers' own metrics come from their processes (promomnibus, or
tail --metrics-addr).`,
		Example: `  omnibus exporter --topic orders --group billing
  omnibus exporter --url kafka://localhost:9092 --topic orders --group billing --group audit --metrics-addr :9464`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.exporter(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic (required)")
	f.StringArrayVarP(&o.groups, "group", "g", nil, "consumer group (required; repeat for more)")
	f.StringVar(&o.metricsAddr, "metrics-addr", ":9464", "address to serve /metrics on (host:port; port 0 picks one)")
	return cmd
}

func (a *app) exporter(ctx context.Context, o exporterOptions) error {
	switch {
	case o.topic == "":
		return usagef("exporter: --topic is required")
	case len(o.groups) == 0:
		return usagef("exporter: --group is required")
	case o.metricsAddr == "":
		return usagef("exporter: --metrics-addr is empty")
	}
	src, closeSrc, err := a.openLag(ctx, o.url)
	if err != nil {
		return err
	}
	defer closeSrc()
	col := promomnibus.New()
	transport := scheme(a.rawURL)
	for _, g := range o.groups {
		col.WatchGroup(transport, o.topic, g, func(ctx context.Context) (promomnibus.GroupLag, error) {
			gl, err := src(ctx, o.topic, g)
			var kind driver.LagKind // a count
			if gl.Millis {
				kind = driver.LagMillis
			}
			return promomnibus.GroupLag{Lanes: gl.Lanes, Members: gl.Members, Kind: kind}, err
		})
	}
	s, err := serveMetrics(o.metricsAddr, col)
	if err != nil {
		return fmt.Errorf("exporter: %w", err)
	}
	fmt.Fprintf(a.stdout, "serving the lag of topic %s, groups %v, at %s; Ctrl-C stops\n", o.topic, o.groups, s.url)
	<-ctx.Done()
	return s.close()
}
