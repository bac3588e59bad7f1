package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/omnibus-go/omnibus"
	pb "github.com/omnibus-go/omnibus/internal/externalscaler"
)

// TestKEDAServesTheGroup: omnibus keda serves KEDA's external scaler for a
// group: a gRPC client of KEDA's proto reads the metric spec, a group
// size that follows the lag (8 members for 4,000 messages at 500 each,
// once the lanes progress), and whether the group is active; Ctrl-C
// stops it cleanly.
func TestKEDAServesTheGroup(t *testing.T) {
	raw, c := memURL(t, "?partitions=8")
	ctx := ctxT(t)
	gate := make(chan struct{})
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(8))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	var ms []*omnibus.Message
	for i := range 4000 {
		ms = append(ms, &omnibus.Message{Key: strconv.Itoa(i), Body: []byte("x")})
	}
	if err := c.Publish(ctx, "orders", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	cmdCtx, stop := context.WithCancel(ctx)
	done := make(chan result, 1)
	go func() {
		done <- runCmd(t, cmdCtx, nil, "", "keda", "--url", raw, "--topic", "orders", "--group", "billing",
			"--target-lag", "500", "--interval", "20ms", "--up-cooldown", "1ms", "--listen", addr)
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	scaler := pb.NewExternalScalerClient(conn)
	ref := &pb.ScaledObjectRef{Name: "billing", Namespace: "shop", ScalerMetadata: map[string]string{"topic": "orders", "group": "billing"}}
	// Messages settle one at a time, so lanes progress while the lag
	// stays near 4,000.
	go func() {
		for {
			select {
			case gate <- struct{}{}:
				time.Sleep(5 * time.Millisecond)
			case <-ctx.Done():
				return
			}
		}
	}()
	var last int64
	eventually(t, 30*time.Second, func() error {
		r, err := scaler.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "omnibus-orders-billing"})
		if err != nil {
			return err
		}
		if last = r.MetricValues[0].MetricValue; last != 8 {
			return fmt.Errorf("metric %d, want 8", last)
		}
		return nil
	})
	spec, err := scaler.GetMetricSpec(ctx, ref)
	if err != nil || spec.MetricSpecs[0].MetricName != "omnibus-orders-billing" || spec.MetricSpecs[0].TargetSize != 1 {
		t.Errorf("GetMetricSpec: %v, %v", spec, err)
	}
	if r, err := scaler.IsActive(ctx, ref); err != nil || !r.Result {
		t.Errorf("IsActive with lag: %v, %v", r, err)
	}
	stop()
	r := <-done
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "KEDA external scaler for group billing of topic orders on "+addr+" (metric omnibus-orders-billing, 1 members per replica)") {
		t.Errorf("stdout %q", r.stdout)
	}
}
