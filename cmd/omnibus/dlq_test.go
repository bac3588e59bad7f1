package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/dlq"
	"github.com/omnibus-go/omnibus/dlq/dlqtest"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
)

// TestDLQReplay: on Kafka (kfake) and RabbitMQ, 1,000 dead letters (one
// with a body of 600 KiB) are listed (the large body cut in the view)
// and shown; a replay to a topic that does not exist fails and moves
// nothing; replay --all hands each message back to the service exactly
// once (counted by ID), the large body whole; the dead-letter topic is
// then empty.
func TestDLQReplay(t *testing.T) {
	for _, tr := range observetest.Transports {
		if tr.Name != "kafka" && tr.Name != "rabbitmq" {
			continue
		}
		t.Run(tr.Name, func(t *testing.T) {
			ctx := ctxT(t)
			ns := observetest.Namespace()
			raw := tr.URL(t, ns)
			c := observetest.Open(t, raw)
			topic := ns + ".orders"
			if err := c.CreateTopic(ctx, topic, 4); err != nil {
				t.Fatal(err)
			}
			svc := dlqtest.Start(t, ctx, c, topic, "billing")
			large := bytes.Repeat([]byte("large body "), 600<<10/11)
			const n = 1000
			ids := svc.Publish(t, ctx, c, topic, n, func(i int) []byte {
				if i == 500 {
					return large
				}
				return fmt.Appendf(nil, `{"order":%d}`, i)
			})

			r := runCmd(t, ctx, nil, "", "dlq", "list", "--url", raw, "--topic", topic, "--limit", "5000", "--json")
			wantCode(t, r, exitOK)
			var views []dlq.View
			dec := json.NewDecoder(strings.NewReader(r.stdout))
			for dec.More() {
				var v dlq.View
				if err := dec.Decode(&v); err != nil {
					t.Fatalf("list --json: %v", err)
				}
				views = append(views, v)
			}
			if len(views) != n {
				t.Fatalf("list --json printed %d dead letters, want %d", len(views), n)
			}
			for _, v := range views {
				if v.ID == ids[500] && (!v.BodyTruncated || v.BodyBytes != len(large) || len(v.Body) != 4096) {
					t.Errorf("the large body listed with %d of %d bytes, truncated %v; want 4096 of %d", len(v.Body), v.BodyBytes, v.BodyTruncated, len(large))
				}
				if v.Reason == "" || v.OriginTopic != topic || v.OriginGroup != "billing" || v.Attempts != 1 || v.LastFailure == nil {
					t.Errorf("listed %+v: the failure is not told", v)
					break
				}
			}

			r = runCmd(t, ctx, nil, "", "dlq", "show", "--url", raw, "--topic", topic, ids[500])
			wantCode(t, r, exitOK)
			if !regexp.MustCompile(`(?m)^reason +poison: k19$`).MatchString(r.stdout) || !strings.Contains(r.stdout, fmt.Sprintf("cut at 65536 of %d bytes", len(large))) ||
				len(r.stdout) > 70<<10 {
				t.Errorf("show of the large dead letter (%d bytes printed):\n%.600s", len(r.stdout), r.stdout)
			}

			r = runCmd(t, ctx, nil, "", "dlq", "replay", "--url", raw, "--topic", topic, "--all", "--to", ns+".nowhere")
			wantCode(t, r, exitFailed)
			if !strings.Contains(r.stderr, "does not exist") || strings.Contains(r.stderr, ":guest@") {
				t.Errorf("replay to a missing topic: stderr %q; want it to say the topic does not exist, without the password", r.stderr)
			}
			r = runCmd(t, ctx, nil, "", "dlq", "list", "--url", raw, "--topic", topic, "--limit", "5000")
			wantCode(t, r, exitOK)
			if !strings.Contains(r.stdout, fmt.Sprintf("\n%d dead letters in %s.dlq", n, topic)) {
				t.Errorf("after the failed replay: %.300s...%s", r.stdout, r.stdout[max(0, len(r.stdout)-300):])
			}

			r = runCmd(t, ctx, nil, "", "dlq", "replay", "--url", raw, "--topic", topic, "--all", "--json")
			wantCode(t, r, exitOK)
			var p progressJSON
			if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.Replayed != n || p.Read != n || p.Moved != 0 {
				t.Errorf("replay --all --json: %s (%v); want %d replayed", r.stdout, err, n)
			}
			svc.AllowTwice(p.Republished)
			svc.WaitHandled(t, ids)
			if m := svc.Message(ids[500]); !bytes.Equal(m.Body, large) {
				t.Errorf("the large body came back with %d bytes, want %d", len(m.Body), len(large))
			}

			r = runCmd(t, ctx, nil, "", "dlq", "list", "--url", raw, "--topic", topic+".dlq")
			wantCode(t, r, exitOK)
			if r.stdout != "no dead letters in "+topic+".dlq\n" {
				t.Errorf("after replay --all: %q", r.stdout)
			}
		})
	}
}

// TestDLQUsage: selections and flags the dlq commands refuse, with exit
// code 2 and what to do.
func TestDLQUsage(t *testing.T) {
	raw, _ := memURL(t, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "list"}, "--topic is required"},
		{[]string{"dlq", "replay", "--topic", "t"}, "say which dead letters"},
		{[]string{"dlq", "delete", "--topic", "t", "--all", "--key", "k"}, "without filters"},
		{[]string{"dlq", "replay", "--topic", "t", "--since", "yesterday"}, "--since"},
		{[]string{"dlq", "show", "--topic", "t"}, "want one ID"},
		{[]string{"dlq", "show", "--topic", "t", "--format", "yaml", "x"}, "unknown body format"},
		{[]string{"dlq", "list", "--topic", "t", "--limit", "0"}, "--limit"},
	} {
		r := runCmd(t, ctxT(t), nil, "", append(c.args, "--url", raw)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, r.code, r.stderr, exitUsage, c.want)
		}
	}
}

// TestParseWhen: RFC 3339 times and durations ago.
func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got, err := parseWhen("since", "90m", now); err != nil || !got.Equal(now.Add(-90*time.Minute)) {
		t.Errorf("90m: %v, %v", got, err)
	}
	if got, err := parseWhen("since", "2026-01-01T00:00:00Z", now); err != nil || got.Day() != 1 {
		t.Errorf("RFC 3339: %v, %v", got, err)
	}
}

// TestMandatoryURL: RabbitMQ URLs get mandatory=true unless they say.
func TestMandatoryURL(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:guest@h:5672/":              "amqp://guest:guest@h:5672/?mandatory=true",
		"amqps://h/?partitions=4":                 "amqps://h/?partitions=4&mandatory=true",
		"amqp://h/?mandatory=false":               "amqp://h/?mandatory=false",
		"kafka://h:9092":                          "kafka://h:9092",
		"nats://embedded?dir=/tmp/x&partitions=4": "nats://embedded?dir=/tmp/x&partitions=4",
	} {
		if got := mandatoryURL(in); got != want {
			t.Errorf("mandatoryURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReplayReportsRepublished: the replay's retry hook counts every
// message published again, and the summary says how many may arrive
// twice (nothing when none was).
func TestReplayReportsRepublished(t *testing.T) {
	var r retryCount
	r.OnPublishRetry(omnibus.PublishRetry{IDs: []string{"a", "b"}})
	r.OnPublishRetry(omnibus.PublishRetry{IDs: []string{"c"}})
	if n := r.Load(); n != 3 {
		t.Errorf("counted %d messages published again, want 3", n)
	}
	p := dlq.Progress{Read: 5, Selected: 5, Replayed: 5}
	if s := summary("replay", "t.dlq", p, r.Load()); !strings.Contains(s, "; 3 published again after an error left the outcome unknown: each may arrive twice") {
		t.Errorf("summary %q does not say that 3 were published again", s)
	}
	if s := summary("replay", "t.dlq", p, 0); strings.Contains(s, "published again") {
		t.Errorf("summary %q speaks of messages published again when none was", s)
	}
}
