package autoscale_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// The two-process scenario: 12 partitions with 20,000 records each and a
// target of 40,000 records per member ask for 6 members. A member handles
// one 8 ms message at a time (OrderLane, and the records it polls come a
// lane at a time), so 6 members take 50 s to bring the need down to 5,
// longer than the scenario needs to settle. Records are produced and
// fetched in small batches, so that a member's lanes take turns often
// and every lane progresses between samples.
const (
	procPartitions = 12
	procPerLane    = 20000
	procTarget     = 40000
	procNeed       = procPartitions * procPerLane / procTarget
)

// childEnv names the variables that make the test binary a child process
// of TestTwoProcessesShareTheNeed.
const (
	childURL   = "OMNIBUS_AUTOSCALE_CHILD_URL"
	childTopic = "OMNIBUS_AUTOSCALE_CHILD_TOPIC"
)

// childLine is what a child prints per decision.
type childLine struct {
	Current      int      `json:"current"`
	Desired      int      `json:"desired"`
	Group        int      `json:"group"`
	GroupDesired int      `json:"group_desired"`
	Stalled      []string `json:"stalled"`
	Local        int      `json:"local_lanes"`
	Reason       string   `json:"reason"`
}

// TestChildProcess is the child of TestTwoProcessesShareTheNeed: a
// consumer of the group with an autoscaler, printing every decision as
// a JSON line, until its standard input closes. Without the variables it
// does nothing.
func TestChildProcess(t *testing.T) {
	url, topic := os.Getenv(childURL), os.Getenv(childTopic)
	if url == "" {
		t.Skip("the child process of TestTwoProcessesShareTheNeed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	c, err := omnibus.Open(ctx, url, omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		// 40 ms a message: the 12 lanes drain at most 300 a second, so
		// the lag stays above 200,000 (the need of 6 members) for more
		// than 2 minutes however slowly the group settles. At 8 ms, a
		// loaded CI machine drained half the backlog before the group
		// settled, and the need fell to 3.
		time.Sleep(40 * time.Millisecond)
		return nil
	}, omnibus.Group("shared"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(procPartitions), omnibus.Order(omnibus.OrderLane))
	if err != nil {
		t.Fatal(err)
	}
	var out sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	ctl, err := autoscale.New(k, autoscale.Policy{
		TargetLag: procTarget, Interval: 250 * time.Millisecond, UpCooldown: time.Second,
		DownDelay: 3 * time.Second, StallAfter: 20, Logger: quiet(),
		OnDecision: func(d autoscale.Decision) {
			l := childLine{Current: d.Current, Desired: d.Desired, Group: d.Members, GroupDesired: d.GroupDesired, Stalled: d.Stalled, Reason: d.Reason}
			for _, s := range d.Lanes {
				if s.Local {
					l.Local++
				}
			}
			out.Lock()
			_ = enc.Encode(l)
			out.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctl.Run(ctx) }()
	if err := k.Run(ctx); err != nil {
		t.Error(err)
	}
}

// TestTwoProcessesShareTheNeed: two processes (this test binary run
// twice) consume one 12-partition group on one Kafka (kfake, hosted
// here), each with an autoscaler. The group's lag asks for 6 members: the
// group ends at 6, not 12 (each process scaling to the whole need), and
// no process reports a lane stalled because the other one holds it.
func TestTwoProcessesShareTheNeed(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(procPartitions, "shared"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raw, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(512), kgo.MaxBufferedRecords(procPartitions*procPerLane))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for p := range int32(procPartitions) {
		for range procPerLane {
			raw.Produce(ctx, &kgo.Record{Topic: "shared", Partition: p, Value: []byte("x")}, nil)
		}
	}
	if err := raw.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(raw)
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",") +
		"?heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s"

	type child struct {
		mu    sync.Mutex
		lines []childLine
	}
	children := make([]*child, 2)
	for i := range children {
		_, stdout := testenv.Child(t, 30*time.Second, []string{childURL + "=" + url, childTopic + "=shared"}, "-test.run=^TestChildProcess$", "-test.v=false")
		c := &child{}
		children[i] = c
		go func() { // ends when the child exits, at cleanup
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var l childLine
				if json.Unmarshal(sc.Bytes(), &l) == nil {
					c.mu.Lock()
					c.lines = append(c.lines, l)
					c.mu.Unlock()
				}
			}
		}()
	}
	last := func(c *child) (childLine, int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.lines) == 0 {
			return childLine{}, 0
		}
		return c.lines[len(c.lines)-1], len(c.lines)
	}
	// members is the group's member count and the partitions assigned.
	members := func() (int, int) {
		groups, err := adm.DescribeGroups(ctx, "shared")
		if err != nil {
			return -1, -1
		}
		g := groups["shared"]
		assigned := 0
		for _, m := range g.Members {
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range a.Topics {
					assigned += len(t.Partitions)
				}
			}
		}
		return len(g.Members), assigned
	}

	// Settled: the group has the size it needs, both processes hold
	// there, and it stays so for 3 s.
	peak, stableSince := 0, time.Time{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		n, assigned := members()
		peak = max(peak, n)
		a, na := last(children[0])
		b, nb := last(children[1])
		steady := na > 0 && nb > 0 && n == procNeed && assigned == procPartitions && a.Current+b.Current == procNeed &&
			a.Desired == a.Current && b.Desired == b.Current
		switch {
		case !steady:
			stableSince = time.Time{}
		case stableSince.IsZero():
			stableSince = time.Now()
		case time.Since(stableSince) > 3*time.Second:
			goto settled
		}
		if time.Now().After(deadline) {
			t.Fatalf("group never settled at %d members: %d members now (peak %d), %d partitions assigned; last decisions:\n%+v\n%+v", procNeed, n, peak, assigned, a, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
settled:
	for i, c := range children {
		c.mu.Lock()
		for _, l := range c.lines {
			if len(l.Stalled) > 0 {
				t.Errorf("process %d reported lanes %v stalled (%d of its own): %s", i, l.Stalled, l.Local, l.Reason)
			}
			if l.GroupDesired > procNeed {
				t.Errorf("process %d: the group asked for %d, more than the lag's %d: %s", i, l.GroupDesired, procNeed, l.Reason)
			}
		}
		l := c.lines[len(c.lines)-1]
		t.Logf("process %d: %d members, %d lanes of its own, %d decisions; last: %s", i, l.Current, l.Local, len(c.lines), l.Reason)
		c.mu.Unlock()
	}
	// Two processes each taking the whole need would reach 12; rounding
	// while the other process is still joining may pass the need by one.
	if peak > procNeed+1 {
		t.Errorf("the group peaked at %d members, want at most %d (the need, plus one while the second process joins)", peak, procNeed+1)
	}
	t.Logf("group settled at %d members (peak %d)", procNeed, peak)
}
