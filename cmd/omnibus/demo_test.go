package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func wantVerified(t testing.TB, r result, okLines int) {
	t.Helper()
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "verified summary") || !strings.Contains(r.stdout, "\nPASS: ") {
		t.Fatalf("no verified summary:\n%s", r.stdout)
	}
	if got := strings.Count(r.stdout, "\n  ok  "); got != okLines {
		t.Errorf("%d checks ok, want %d:\n%s", got, okLines, r.stdout)
	}
	if strings.Contains(r.stdout, "FAIL") {
		t.Errorf("a check failed:\n%s", r.stdout)
	}
}

// demoRun finds a demo's run ID in its summary ("topic demo.orders.<run>").
var demoRun = regexp.MustCompile(`, topic demo\.orders\.([0-9a-f]+)\):`)

// wantDemoRemoved checks that the demo run r removed what it made on the
// server: holds lists what the server holds named after the run (topics,
// streams, queues, keys, buckets, groups), read with the transport's own
// client.
func wantDemoRemoved(t testing.TB, r result, holds func(run string) []string) {
	t.Helper()
	m := demoRun.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no topic in the demo's summary:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout+r.stderr, "left on the transport") {
		t.Errorf("the demo says it left something:\n%s%s", r.stdout, r.stderr)
	}
	if left := holds(m[1]); len(left) > 0 {
		t.Errorf("the demo left %v on the server", left)
	}
}

func TestDemoMem(t *testing.T) {
	raw, _ := memURL(t, "")
	r := runCmd(t, ctxT(t), nil, "", "demo", "--url", raw, "--orders", "400", "--customers", "8",
		"--rate", "2000", "--work", "1ms", "--consumers", "3", "--poison", "3")
	wantVerified(t, r, 4)
	for _, want := range []string{
		"400 orders from 8 customers",
		"scaling consumers 1 → 3",
		"undecodable order",
		"the payment provider declines it",
		"397 of 397",
		"3 of 3 (2 undecodable: at once; 1 failing: after 3 attempts)",
		"lag left 0",
		"per-customer order held",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestDemoEmbeddedDefault(t *testing.T) {
	r := runCmd(t, ctxT(t), nil, "", "demo", "--orders", "300", "--customers", "6", "--rate", "0", "--work", "1ms")
	ordered := strings.Contains(r.stdout, "key order (per customer)")
	want := 3
	if ordered {
		want = 4
	}
	wantVerified(t, r, want)
	if !strings.Contains(r.stdout, "omnibus demo on "+defaultURL()) {
		t.Errorf("the demo did not run on the default %s:\n%s", defaultURL(), r.stdout)
	}
}

func TestDemoInterrupted(t *testing.T) {
	raw, _ := memURL(t, "")
	ctx, cancel := context.WithCancel(ctxT(t))
	time.AfterFunc(700*time.Millisecond, cancel)
	r := runCmd(t, ctx, nil, "", "demo", "--url", raw, "--orders", "100000", "--rate", "1000", "--work", "5ms")
	wantCode(t, r, exitInterrupted)
	if !strings.Contains(r.stdout, "interrupted after") || !strings.Contains(r.stdout, "drained") {
		t.Errorf("output does not report the interruption:\n%s", r.stdout)
	}
	if r.took > 10*time.Second {
		t.Errorf("demo took %v to stop after Ctrl-C", r.took)
	}
}

func TestLedgerVerifyCatchesFailures(t *testing.T) {
	msg := func(id, attempts string) *omnibus.Message {
		return &omnibus.Message{ID: id, Headers: map[string]string{omnibus.HeaderDeadAttempts: attempts, omnibus.HeaderDeadReason: "boom"}}
	}
	l := newLedger()
	for i, c := range []string{"a", "a", "a", "b"} {
		id := string(rune('1' + i))
		l.expect(id, c)
	}
	l.expectPoison("p1", poisonUndecodable)
	l.expectPoison("p2", poisonFailing)
	l.process(order{ID: "2", Customer: "a", Seq: 2}) // before 1
	l.process(order{ID: "1", Customer: "a", Seq: 1})
	l.process(order{ID: "4", Customer: "b", Seq: 1})
	l.process(order{ID: "4", Customer: "b", Seq: 1}) // a redelivery: allowed
	l.deadLettered(msg("p1", "1"))
	l.deadLettered(msg("p1", "1")) // twice
	l.deadLettered(msg("p2", "2")) // too few attempts
	l.deadLettered(msg("4", "1"))  // a valid order
	checks := l.verify(true, 3, 5)
	for i, c := range checks {
		if c.ok {
			t.Errorf("check %d %q passed, want a failure: %s", i, c.name, c.detail)
		}
	}
	for _, want := range []string{"missing 3", "1 redelivered", "order 2 after 0", "p1 dead-lettered 2 times",
		"want after 3 attempts", "4 is a valid order", "lag left 5"} {
		found := false
		for _, c := range checks {
			found = found || strings.Contains(c.detail, want)
		}
		if !found {
			t.Errorf("no check says %q: %+v", want, checks)
		}
	}
	if l.complete() {
		t.Error("complete() with order 3 missing")
	}
}
