package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestTailMaxReleasesTheRest: on every transport, a group that tails 4
// of 10 messages and then 6 more gets exactly the 10, each once, and the
// second tail does not wait for the transport's redelivery timeout: tail
// acknowledged only what it wrote and handed the rest back at once.
func TestTailMaxReleasesTheRest(t *testing.T) {
	transports := onEveryTransport(3)
	for i, tr := range transports {
		if tr.name == "nats" {
			// natsbus hands back what a closed member held only when the
			// group's ack_wait runs out (2s here, 30s by default).
			transports[i].url = func(t testing.TB) (string, string) { u, topic, _ := natsTopic(t); return u + "?ack_wait=2s", topic }
		}
	}
	transports = append(transports, serverTopic{"mem", func(t testing.TB) (string, string) { raw, _ := memURL(t, "?partitions=3"); return raw, "t" }})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			raw, topic := tr.url(t)
			// The group exists before the messages come.
			c, err := omnibus.Open(ctxT(t), raw)
			if err != nil {
				t.Fatal(err)
			}
			k, err := c.Subscribe(ctxT(t), topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			k.Close()
			c.Close()
			wantCode(t, runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", topic, "--count", "10", "--size", "8", "--keys", "5"), exitOK)
			seen := map[string]int{}
			for _, max := range []string{"4", "6"} {
				r := runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--max", max, "--json")
				wantCode(t, r, exitOK)
				ms := decodeLines(t, r.stdout)
				if got := len(ms); got != map[string]int{"4": 4, "6": 6}[max] {
					t.Fatalf("--max %s printed %d messages", max, got)
				}
				if r.took > 8*time.Second {
					t.Errorf("tail --max %s took %v: it waited for messages held by the tail before", max, r.took)
				}
				if strings.Contains(r.stderr, "WARN") {
					t.Errorf("tail --max %s logged warnings:\n%s", max, r.stderr)
				}
				for _, m := range ms {
					seen[m.ID]++
				}
			}
			if len(seen) != 10 {
				t.Errorf("saw %d distinct messages over both runs, want 10: %v", len(seen), seen)
			}
			for id, n := range seen {
				if n != 1 {
					t.Errorf("message %s printed %d times", id, n)
				}
			}
		})
	}
}
