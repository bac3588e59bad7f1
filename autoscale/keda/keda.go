// Package keda serves a consumer group's desired member count to KEDA as
// an external scaler, so that Kubernetes runs as many replicas of a
// consumer as the group's lag asks for.
//
// KEDA polls an external scaler over gRPC (its externalscaler.proto:
// IsActive, StreamIsActive, GetMetricSpec, GetMetrics). The scaler here
// answers from an autoscale.Controller, normally one made by
// autoscale.NewGroup, which reads the group's lag from outside the group
// and applies the policy (targets, stalled lanes, cooldowns):
//
//   - GetMetricSpec names one metric per group, omnibus-<topic>-<group>,
//     with a target of MembersPerReplica;
//   - GetMetrics reports the group's desired member count, so the
//     Horizontal Pod Autoscaler runs desired / MembersPerReplica replicas,
//     rounded up;
//   - IsActive and StreamIsActive report whether the group has work (a lane
//     with lag, or one whose lag is unknown), which is what scales a
//     group from zero replicas and back.
//
// The server is started by Serve, or registered on a grpc.Server of the
// caller's with Server.Register; the CLI's omnibus keda runs one. A
// ScaledObject selects the group with its metadata (topic, group; both
// optional when the server serves one group) and may set
// membersPerReplica; docs/KEDA.md shows one.
//
// # Concurrency
//
// A Server answers calls concurrently; it reads each controller's last
// decision and never runs a controller itself: the caller runs
// Controller.Run.
package keda

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	pb "github.com/omnibus-go/omnibus/internal/externalscaler"
)

// Group is one consumer group served to KEDA.
type Group struct {
	Topic string
	Group string
	// Controller decides the group's size; its Desired is the metric.
	Controller *autoscale.Controller
	// MembersPerReplica is how many group members one replica runs (its
	// omnibus.Members, or the members its own autoscaler keeps): the
	// metric's target. A ScaledObject's membersPerReplica overrides it.
	// Default: 1.
	MembersPerReplica int
}

// Server is KEDA's external scaler service for a set of groups.
type Server struct {
	pb.UnimplementedExternalScalerServer
	groups []Group
	done   chan struct{} // closed by Serve when it stops: streams end
}

// NewServer returns a server for groups: at least one, each with a
// controller, a topic and a group, no two the same.
func NewServer(groups ...Group) (*Server, error) {
	if len(groups) == 0 {
		return nil, fmt.Errorf("keda: no group to serve: %w", omnibus.ErrInvalid)
	}
	seen := map[string]bool{}
	for i, g := range groups {
		switch {
		case g.Controller == nil || g.Topic == "" || g.Group == "":
			return nil, fmt.Errorf("keda: group %d needs a topic, a group and a controller: %w", i, omnibus.ErrInvalid)
		case g.MembersPerReplica < 0:
			return nil, fmt.Errorf("keda: group %q: MembersPerReplica %d is negative: %w", g.Group, g.MembersPerReplica, omnibus.ErrInvalid)
		case seen[g.Topic+"\x00"+g.Group]:
			return nil, fmt.Errorf("keda: group %q of topic %q given twice: %w", g.Group, g.Topic, omnibus.ErrInvalid)
		}
		seen[g.Topic+"\x00"+g.Group] = true
		if g.MembersPerReplica == 0 {
			groups[i].MembersPerReplica = 1
		}
	}
	return &Server{groups: groups, done: make(chan struct{})}, nil
}

// Register registers the service on gs.
func (s *Server) Register(gs *grpc.Server) { pb.RegisterExternalScalerServer(gs, s) }

// Serve serves KEDA's external scaler for groups on lis until ctx ends,
// then stops (open streams end) and returns nil; it returns the error
// that stopped it otherwise.
func Serve(ctx context.Context, lis net.Listener, groups ...Group) error {
	s, err := NewServer(groups...)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	s.Register(gs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	select {
	case err := <-served:
		close(s.done)
		return fmt.Errorf("keda: serve %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	close(s.done)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		gs.Stop()
		<-stopped
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("keda: serve %s: %w", lis.Addr(), err)
	}
	return nil
}

// group finds the group a ScaledObject names in its metadata.
func (s *Server) group(ref *pb.ScaledObjectRef) (Group, error) {
	md := ref.GetScalerMetadata()
	topic, group := md["topic"], md["group"]
	if topic == "" && group == "" && len(s.groups) == 1 {
		return s.groups[0], nil
	}
	for _, g := range s.groups {
		if (topic == "" || g.Topic == topic) && (group == "" || g.Group == group) {
			if topic == "" || group == "" {
				for _, o := range s.groups {
					if o != g && (topic == "" || o.Topic == topic) && (group == "" || o.Group == group) {
						return Group{}, status.Errorf(codes.InvalidArgument, "ScaledObject %s/%s: topic %q group %q match more than one group served; name both", ref.GetNamespace(), ref.GetName(), topic, group)
					}
				}
			}
			return g, nil
		}
	}
	return Group{}, status.Errorf(codes.NotFound, "ScaledObject %s/%s: no group %q of topic %q served here (metadata topic and group)", ref.GetNamespace(), ref.GetName(), group, topic)
}

// perReplica is the metric's target: the ScaledObject's
// membersPerReplica, else the group's.
func perReplica(ref *pb.ScaledObjectRef, g Group) (int, error) {
	v, ok := ref.GetScalerMetadata()["membersPerReplica"]
	if !ok {
		return g.MembersPerReplica, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, status.Errorf(codes.InvalidArgument, "ScaledObject %s/%s: membersPerReplica %q: want a positive integer", ref.GetNamespace(), ref.GetName(), v)
	}
	return n, nil
}

// MetricName is the metric a group is served under.
func MetricName(topic, group string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '-'
		}, strings.ToLower(s))
	}
	return "omnibus-" + clean(topic) + "-" + clean(group)
}

// IsActive reports whether the group has work; true before the first
// decision (unknown is never idle).
func (s *Server) IsActive(_ context.Context, ref *pb.ScaledObjectRef) (*pb.IsActiveResponse, error) {
	g, err := s.group(ref)
	if err != nil {
		return nil, err
	}
	d, ok, _ := g.Controller.Watch()
	return &pb.IsActiveResponse{Result: !ok || d.Active}, nil
}

// StreamIsActive sends whether the group has work at once (after the
// controller's first decision) and again whenever it changes, until KEDA
// ends the stream or the server stops.
func (s *Server) StreamIsActive(ref *pb.ScaledObjectRef, stream grpc.ServerStreamingServer[pb.IsActiveResponse]) error {
	g, err := s.group(ref)
	if err != nil {
		return err
	}
	sent, last := false, false
	for {
		d, ok, next := g.Controller.Watch()
		if ok && (!sent || d.Active != last) {
			if err := stream.Send(&pb.IsActiveResponse{Result: d.Active}); err != nil {
				return err
			}
			sent, last = true, d.Active
		}
		select {
		case <-next:
		case <-stream.Context().Done():
			return nil
		case <-s.done:
			return nil
		}
	}
}

// GetMetricSpec names the group's metric, with MembersPerReplica as its
// target.
func (s *Server) GetMetricSpec(_ context.Context, ref *pb.ScaledObjectRef) (*pb.GetMetricSpecResponse, error) {
	g, err := s.group(ref)
	if err != nil {
		return nil, err
	}
	n, err := perReplica(ref, g)
	if err != nil {
		return nil, err
	}
	return &pb.GetMetricSpecResponse{MetricSpecs: []*pb.MetricSpec{{
		MetricName: MetricName(g.Topic, g.Group), TargetSize: int64(n), TargetSizeFloat: float64(n),
	}}}, nil
}

// GetMetrics reports the group's desired member count. Before the
// controller's first decision it fails with Unavailable: KEDA keeps the
// current size.
func (s *Server) GetMetrics(_ context.Context, req *pb.GetMetricsRequest) (*pb.GetMetricsResponse, error) {
	g, err := s.group(req.GetScaledObjectRef())
	if err != nil {
		return nil, err
	}
	if _, ok, _ := g.Controller.Watch(); !ok {
		return nil, status.Errorf(codes.Unavailable, "group %q of topic %q: no decision yet", g.Group, g.Topic)
	}
	n := g.Controller.Desired()
	return &pb.GetMetricsResponse{MetricValues: []*pb.MetricValue{{
		MetricName: MetricName(g.Topic, g.Group), MetricValue: int64(n), MetricValueFloat: float64(n),
	}}}, nil
}
