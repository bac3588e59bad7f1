package transporttest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/omnibus-go/omnibus"
)

// deliver adds to c a delivery of message id, numbered seq, of key k.
func deliver(c *collector, id string, seq int64, k string) {
	c.add(&omnibus.Message{ID: id, Key: k, Headers: map[string]string{headerSeq: strconv.FormatInt(seq, 10)}})
}

// TestVerdictCopies: the copies of messages published again are allowed,
// out of their key's order too, only where the transport stores such
// messages twice, only for the IDs published again, and only as many
// times as they were; every other duplicate fails a test that allows
// none.
func TestVerdictCopies(t *testing.T) {
	// Messages a, b, c of key k, then each again (their copies landed
	// behind them), and a once more.
	c := newCollector()
	for i, id := range []string{"a", "b", "c", "a", "b", "c", "a"} {
		deliver(c, id, int64(i%3+1), "k")
	}
	once := func(ids ...string) func(string) int {
		return func(id string) int {
			if strings.Contains(strings.Join(ids, " "), id) {
				return 1
			}
			return 0
		}
	}
	twice := func(string) int { return 2 }
	for _, tc := range []struct {
		name          string
		storesTwice   bool
		resends       func(string) int
		dupsAllowed   bool
		wantFailures  []string
		wantCopyNotes string
	}{
		{"AllResentTwice", true, twice, false, nil, "4 deliveries of copies"},
		{"AllResentOnce", true, once("a", "b", "c"), false, []string{"key order broken 1 times", "1 duplicate deliveries of 3 messages"}, "3 deliveries of copies"},
		{"NotDeclared", false, twice, false, []string{"key order broken 3 times", "4 duplicate deliveries"}, ""},
		{"SomeResent", true, once("a"), false, []string{"key order broken 2 times", "3 duplicate deliveries"}, "1 deliveries of copies"},
		{"NoneResent", true, once(), false, []string{"key order broken 3 times", "4 duplicate deliveries"}, ""},
		{"DupsAllowed", false, twice, true, []string{"key order broken 3 times"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures, notes := c.verdict(tc.storesTwice, tc.resends, keyOrder, tc.dupsAllowed)
			if len(failures) != len(tc.wantFailures) {
				t.Fatalf("failures %q, want %d starting %q", failures, len(tc.wantFailures), tc.wantFailures)
			}
			for i, f := range failures {
				if !strings.HasPrefix(f, tc.wantFailures[i]) {
					t.Errorf("failure %d: %q, want it to start %q", i, f, tc.wantFailures[i])
				}
			}
			got := ""
			for _, n := range notes {
				if strings.Contains(n, "copies") {
					got = n
				}
			}
			if !strings.HasPrefix(got, tc.wantCopyNotes) || (tc.wantCopyNotes == "") != (got == "") {
				t.Errorf("note %q, want one starting %q", got, tc.wantCopyNotes)
			}
		})
	}
}

// TestRecordResends: the hook records messages published again after an
// unknown outcome, not after ErrRetryable (the server cannot have acted);
// only a Run whose harness declares ResendsStoredTwice, and its subtests,
// allow their copies.
func TestRecordResends(t *testing.T) {
	h := RecordResends().(omnibus.PublishRetryHook)
	unknown := fmt.Errorf("no answer: %w", omnibus.ErrOutcomeUnknown)
	refused := fmt.Errorf("throttled: %w", omnibus.ErrRetryable)
	h.OnPublishRetry(omnibus.PublishRetry{IDs: []string{"resend-u1", "resend-u2"}, Err: unknown})
	h.OnPublishRetry(omnibus.PublishRetry{IDs: []string{"resend-u1"}, Err: unknown})
	h.OnPublishRetry(omnibus.PublishRetry{IDs: []string{"resend-r1"}, Err: refused})
	for id, want := range map[string]int{"resend-u1": 2, "resend-u2": 1, "resend-r1": 0} {
		if got := resends(id); got != want {
			t.Errorf("resends(%q) = %d, want %d", id, got, want)
		}
	}
	if storesResendsTwice(t) {
		t.Fatal("a test outside a declaring Run allows copies")
	}
	storesTwice.Store(t.Name(), true)
	defer storesTwice.Delete(t.Name())
	t.Run("Sub", func(t *testing.T) {
		if !storesResendsTwice(t) {
			t.Error("a subtest of a declaring Run allows no copies")
		}
	})
}

// TestVerdictNamesDuplicates: a duplicate's failure names the message
// and, for each of its deliveries, its lane, position and attempt.
func TestVerdictNamesDuplicates(t *testing.T) {
	c := newCollector()
	for _, m := range []*omnibus.Message{
		{ID: "a", Key: "k", Lane: "1", Position: "7", Attempt: 1},
		{ID: "b", Key: "k", Lane: "1", Position: "8", Attempt: 1},
		{ID: "a", Key: "k", Lane: "1", Position: "7", Attempt: 2},
	} {
		c.add(m)
	}
	failures, _ := c.verdict(false, func(string) int { return 0 }, anyOrder, false)
	if len(failures) != 1 {
		t.Fatalf("failures %q, want one", failures)
	}
	for _, want := range []string{
		"1 duplicate deliveries of 2 messages",
		`"a" (key "k") handled 2 times`,
		`lane "1" position "7" attempt 1`,
		`lane "1" position "7" attempt 2`,
	} {
		if !strings.Contains(failures[0], want) {
			t.Errorf("failure %q does not say %q", failures[0], want)
		}
	}
	if strings.Contains(failures[0], `"b"`) || strings.Contains(failures[0], `position "8"`) {
		t.Errorf("failure %q names a message handled once", failures[0])
	}
}
