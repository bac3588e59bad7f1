package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestLagStatusOnEveryTransport: a group with lag and no members is STOP
// on every transport (as the help says), and a group whose member is
// stuck is not OK on the first --watch report (EARLY), then STALL.
func TestLagStatusOnEveryTransport(t *testing.T) {
	for _, tr := range onEveryTransport(2) {
		t.Run(tr.name, func(t *testing.T) {
			raw, topic := tr.url(t)
			ctx := ctxT(t)
			c, err := omnibus.Open(ctx, raw)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}
			// A member that takes one message and never finishes it.
			release := make(chan struct{})
			k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, omnibus.Group("stuck"), omnibus.MaxInFlight(1))
			if err != nil {
				t.Fatal(err)
			}
			go k.Run(ctx)
			publish50 := func() {
				ms := make([]*omnibus.Message, 50)
				for i := range ms {
					ms[i] = &omnibus.Message{Key: "k", Body: []byte("x")}
				}
				if err := c.Publish(ctx, topic, ms...); err != nil {
					t.Fatal(err)
				}
			}
			publish50()
			lag := func(group string, args ...string) lagReport {
				t.Helper()
				r := runCmd(t, ctx, nil, "", append([]string{"lag", "--url", raw, "--topic", topic, "--group", group, "--json"}, args...)...)
				wantCode(t, r, exitOK)
				var rep lagReport
				if err := json.Unmarshal([]byte(strings.SplitN(r.stdout, "\n", 2)[0]), &rep); err != nil {
					t.Fatalf("lag printed %q: %v", r.stdout, err)
				}
				return rep
			}
			eventually(t, 30*time.Second, func() error {
				if rep := lag("stuck", "--samples", "1"); rep.Total < 49 || rep.Status != statusEarly {
					return fmt.Errorf("first report %+v, want lag 49 or 50 and EARLY (one sample)", rep)
				}
				return nil
			})
			rep := lag("stuck", "--samples", "3", "--interval", "100ms")
			if rep.Status != statusStall {
				t.Errorf("report %+v, want STALL: a member, and no progress", rep)
			}
			// The age of the stuck lane: at least the 100ms between the
			// samples, where the transport tells (Capabilities.Age);
			// RabbitMQ and NSQ cannot from another process (the member
			// holds the queue's head).
			outside := tr.name == "rabbitmq" || tr.name == "nsq"
			for _, l := range rep.Lanes {
				switch {
				case l.Lag == 0:
				case !c.Capabilities().Age:
					if l.Age != nil {
						t.Errorf("lane %s: age %vs from a transport that reports none", l.Lane, *l.Age)
					}
				case outside && l.Age != nil:
					t.Errorf("lane %s: age %vs, want unknown from outside the member's process", l.Lane, *l.Age)
				case !outside && (l.Age == nil || *l.Age < 0.2 || rep.MaxAge == nil || *rep.MaxAge < *l.Age):
					t.Errorf("lane %s: age %v (max %v), want at least 0.2s", l.Lane, l.Age, rep.MaxAge)
				}
			}
			close(release)
			k.Close()

			// A group whose members have left: its lag is STOP.
			left, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("left"))
			if err != nil {
				t.Fatal(err)
			}
			go left.Run(ctx)
			time.Sleep(200 * time.Millisecond)
			if err := left.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			publish50()
			eventually(t, 30*time.Second, func() error {
				if rep := lag("left", "--samples", "2", "--interval", "50ms"); rep.Total != 50 || rep.Status != statusStop {
					return fmt.Errorf("report %+v, want lag 50 and STOP: no members", rep)
				}
				return nil
			})
		})
	}
}

// TestLagKafkaMissingTopic: the lag of a group on a topic that does not
// exist is an error, not a total of 0.
func TestLagKafkaMissingTopic(t *testing.T) {
	raw := kafkaURL(t)
	wantCode(t, runCmd(t, ctxT(t), nil, "a\n", "send", "--url", raw, "--topic", "real"), exitOK)
	wantCode(t, runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "real", "--group", "g", "--from", "earliest", "--max", "1"), exitOK)
	r := runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "nosuch", "--group", "g")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, `topic "nosuch": not found`, "")
}
