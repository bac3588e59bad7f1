package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func decodeLines(t testing.TB, out string) []tailMessage {
	t.Helper()
	var ms []tailMessage
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var m tailMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		ms = append(ms, m)
	}
	return ms
}

func TestSendLinesThenTailJSON(t *testing.T) {
	raw, _ := memURL(t, "")
	r := runCmd(t, ctxT(t), nil, "first\r\nsecond\n\nfourth", "send", "--url", raw, "--topic", "orders",
		"--key", "customer-7", "--header", "kind=test", "--header", "eq=a=b", "--type", "order.created")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "sent 4, failed 0, ") || !strings.Contains(r.stdout, "msgs/s") {
		t.Errorf("summary = %q, want sent 4, failed 0, N msgs/s", r.stdout)
	}

	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "orders", "--from", "earliest", "--max", "4", "--json")
	wantCode(t, r, exitOK)
	ms := decodeLines(t, r.stdout)
	var bodies []string
	for _, m := range ms {
		bodies = append(bodies, m.Body)
		if m.Key != "customer-7" || m.Type != "order.created" || m.Topic != "orders" || m.ID == "" ||
			m.Lane == "" || m.Position == "" || m.Time.IsZero() || m.BodyBase64 ||
			m.Headers["kind"] != "test" || m.Headers["eq"] != "a=b" {
			t.Errorf("message %+v: fields not as sent", m)
		}
	}
	if got, want := strings.Join(bodies, "|"), "first|second||fourth"; got != want {
		t.Errorf("bodies %q, want %q (one key: one lane, in order)", got, want)
	}
	// Every field the issue names is present, even when empty.
	line := strings.SplitN(r.stdout, "\n", 2)[0]
	for _, f := range []string{"id", "key", "type", "source", "time", "headers", "body", "topic", "lane", "position"} {
		if !strings.Contains(line, `"`+f+`":`) {
			t.Errorf("JSON line %s lacks field %q", line, f)
		}
	}
}

func TestTailBinaryBodyIsBase64(t *testing.T) {
	raw, c := memURL(t, "")
	body := []byte{0xff, 0xfe, 0x00, 'x'}
	if err := c.Publish(ctxT(t), "bin", &omnibus.Message{Body: body}); err != nil {
		t.Fatal(err)
	}
	r := runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "bin", "--from", "earliest", "--max", "1", "--json")
	wantCode(t, r, exitOK)
	ms := decodeLines(t, r.stdout)
	if len(ms) != 1 || !ms[0].BodyBase64 || ms[0].Body != base64.StdEncoding.EncodeToString(body) {
		t.Fatalf("got %+v, want the body in base64 with body_base64 true", ms)
	}
	if !strings.Contains(r.stdout, `"body_base64":true`) {
		t.Errorf("JSON %s lacks \"body_base64\":true", r.stdout)
	}

	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "bin", "--from", "earliest", "--max", "1")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "| base64:"+base64.StdEncoding.EncodeToString(body)) {
		t.Errorf("text output %q does not show the body as base64", r.stdout)
	}
}

func TestTailStopsOnInterrupt(t *testing.T) {
	raw, _ := memURL(t, "")
	ctx, cancel := context.WithCancel(ctxT(t))
	time.AfterFunc(300*time.Millisecond, cancel)
	r := runCmd(t, ctx, nil, "", "tail", "--url", raw, "--topic", "quiet")
	wantCode(t, r, exitOK)
	if r.took > 5*time.Second {
		t.Errorf("tail took %v to stop after Ctrl-C", r.took)
	}
}

func TestSendGenerated(t *testing.T) {
	raw, _ := memURL(t, "")
	r := runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", "gen", "--count", "250", "--size", "32", "--keys", "5", "--batch", "7")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "sent 250, failed 0, ") {
		t.Errorf("summary %q", r.stdout)
	}
	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "gen", "--from", "earliest", "--max", "250", "--json")
	wantCode(t, r, exitOK)
	keys := map[string]bool{}
	for _, m := range decodeLines(t, r.stdout) {
		keys[m.Key] = true
		if len(m.Body) != 32 {
			t.Fatalf("body %q is %d bytes, want 32", m.Body, len(m.Body))
		}
	}
	if len(keys) != 5 {
		t.Errorf("%d distinct keys, want 5", len(keys))
	}
}

func TestSendReportsFailures(t *testing.T) {
	raw, _ := memURL(t, "?max_bytes=100")
	r := runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", "big", "--count", "5", "--size", "60", "--batch", "5",
		"--header", "pad="+strings.Repeat("p", 50))
	wantCode(t, r, exitFailed)
	if !strings.HasPrefix(r.stdout, "sent 0, failed 5, ") {
		t.Errorf("summary %q, want 0 sent and 5 failed", r.stdout)
	}
	wantOneLineError(t, r, "5 message(s) failed", "")
}
