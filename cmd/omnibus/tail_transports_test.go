package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestTailMaxReleasesTheRest: on every transport, a group that tails 4
// of 10 messages and then 6 more gets exactly the 10, each once, and the
// second tail does not wait for the transport's redelivery timeout: tail
// acknowledged only what it wrote and handed the rest back at once.
func TestTailMaxReleasesTheRest(t *testing.T) {
	transports := append(onEveryTransport(3), serverTopic{"mem", func(t testing.TB) (string, string) { raw, _ := memURL(t, "?partitions=3"); return raw, "t" }})
	for i, tr := range transports {
		if tr.name == "nats" {
			// On NATS without partitions a message a tail held may come
			// back twice (the engine nacks it as its handler ends with the
			// consumer, and natsbus hands it back as it closes), and
			// another only after ack_wait (2s here, 30s by default).
			transports[i].url = func(t testing.TB) (string, string) { u, topic, _ := natsTopic(t); return u + "?ack_wait=2s", topic }
		}
	}
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
			// The first tail prints 4; the next ones print the rest. What the
			// first printed never comes again; nothing is lost.
			first := map[string]bool{}
			seen := map[string]int{}
			for i, max := range []string{"4", "6", "1"} {
				if i == 2 && len(seen) == 10 {
					break
				}
				r := runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--max", max, "--json")
				wantCode(t, r, exitOK)
				ms := decodeLines(t, r.stdout)
				if got := strconv.Itoa(len(ms)); got != max {
					t.Fatalf("--max %s printed %s messages", max, got)
				}
				if r.took > 8*time.Second {
					t.Errorf("tail --max %s took %v: it waited for messages held by the tail before", max, r.took)
				}
				for _, m := range ms {
					if i == 0 {
						first[m.ID] = true
					} else if first[m.ID] {
						t.Errorf("message %s printed by the first tail came again: it was not acknowledged", m.ID)
					}
					seen[m.ID]++
				}
			}
			if len(seen) != 10 {
				t.Errorf("saw %d distinct messages, want 10: %v", len(seen), seen)
			}
			for id, n := range seen {
				if n != 1 && tr.name != "nats" { // see above
					t.Errorf("message %s printed %d times", id, n)
				}
			}
		})
	}
}
