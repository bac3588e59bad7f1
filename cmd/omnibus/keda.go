package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/autoscale/keda"
)

type kedaOptions struct {
	url        string
	topic      string
	group      string
	listen     string
	targetLag  int64
	targetAge  time.Duration
	min, max   int
	perReplica int
	interval   time.Duration
	upCooldown time.Duration
	downDelay  time.Duration
}

func (a *app) kedaCmd() *cobra.Command {
	var o kedaOptions
	cmd := &cobra.Command{
		Use:   "keda --topic T --group G (--target-lag N | --target-age D) [--listen ADDR]",
		Short: "Serve KEDA's external scaler for a consumer group",
		Long: `keda serves KEDA's external scaler (gRPC, KEDA's externalscaler.proto) for
one consumer group until Ctrl-C, so that Kubernetes runs as many replicas of
the group's consumer as its lag asks for. It reads the group's lag and
members from outside the group, as lag does, every --interval, and decides
the group's size by the autoscaler's policy: a target lag per member
(--target-lag, in the transport's unit) and/or a target age of the oldest
unsettled message (--target-age), stalled lanes left out, up at once, down
after --down-delay. GetMetrics reports that size; GetMetricSpec asks for
--members-per-replica members per replica; IsActive says whether the group
has any lag (or lag it cannot read), for scaling from zero. Decisions that
change the size are logged to stderr.`,
		Example: `  omnibus keda --url kafka://kafka:9092 --topic orders --group billing --target-lag 1000
  omnibus keda --url nats://nats:4222 --topic orders --group billing --target-age 30s --listen :9090`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.keda(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic (required)")
	f.StringVarP(&o.group, "group", "g", "", "consumer group (required)")
	f.StringVar(&o.listen, "listen", ":9090", "address to serve gRPC on")
	f.Int64Var(&o.targetLag, "target-lag", 0, "lag one member should carry, in the transport's unit")
	f.DurationVar(&o.targetAge, "target-age", 0, "how long the oldest unsettled message of a lane may wait")
	f.IntVar(&o.min, "min", 1, "fewest members of the group")
	f.IntVar(&o.max, "max", 0, "most members of the group (default: the lane count where lanes cap it, else 8)")
	f.IntVar(&o.perReplica, "members-per-replica", 1, "members one replica runs (the metric's target)")
	f.DurationVar(&o.interval, "interval", 5*time.Second, "time between lag samples")
	f.DurationVar(&o.upCooldown, "up-cooldown", 15*time.Second, "least time between two scale-ups")
	f.DurationVar(&o.downDelay, "down-delay", 2*time.Minute, "how long the lag must ask for fewer before scaling down")
	return cmd
}

func (a *app) keda(ctx context.Context, o kedaOptions) error {
	switch {
	case o.topic == "":
		return usagef("keda: --topic is required")
	case o.group == "":
		return usagef("keda: --group is required")
	case o.targetLag <= 0 && o.targetAge <= 0:
		return usagef("keda: set --target-lag, --target-age or both")
	case o.targetLag < 0 || o.targetAge < 0 || o.interval <= 0 || o.perReplica < 1 || o.min < 0 || o.max < 0:
		return usagef("keda: targets, --min and --max must not be negative; --interval and --members-per-replica must be positive")
	}
	c, err := a.open(ctx, o.url)
	if err != nil {
		return err
	}
	defer a.closeClient(c)
	a.noteProcessLocal()
	ctl, err := autoscale.NewGroup(c, o.topic, o.group, autoscale.Policy{
		TargetLag: o.targetLag, TargetAge: o.targetAge, Min: o.min, Max: o.max,
		Interval: o.interval, UpCooldown: o.upCooldown, DownDelay: o.downDelay,
		Logger: slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		return fmt.Errorf("keda: %w", err)
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("keda: %w", err)
	}
	fmt.Fprintf(a.stdout, "KEDA external scaler for group %s of topic %s on %s (metric %s, %d members per replica); Ctrl-C stops it\n",
		o.group, o.topic, lis.Addr(), keda.MetricName(o.topic, o.group), o.perReplica)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan struct{})
	go func() { defer close(ran); _ = ctl.Run(ctx) }()
	err = keda.Serve(ctx, lis, keda.Group{Topic: o.topic, Group: o.group, Controller: ctl, MembersPerReplica: o.perReplica})
	cancel()
	<-ran
	return err
}
