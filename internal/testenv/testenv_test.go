package testenv

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a test ended.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper()             {}
func (r *recorder) Fatal(args ...any)   { r.failed = args[0].(string) }
func (r *recorder) Skip(args ...any)    { r.skipped = args[0].(string) }
func (r *recorder) Name() string        { return "recorder" }
func (r *recorder) Logf(string, ...any) {}

// TestSkipOrFail: outside CI a test that cannot run here is skipped with
// the reason and the remedy; in CI it fails.
func TestSkipOrFail(t *testing.T) {
	const msg = "partitioned mode needs RabbitMQ's consistent-hash exchange; enable it with: " + EnableHashPlugin
	t.Setenv("CI", "")
	r := &recorder{}
	SkipOrFail(r, "missing plugin", msg)
	if r.failed != "" || !strings.HasPrefix(r.skipped, "SKIP (missing plugin): ") || !strings.Contains(r.skipped, EnableHashPlugin) {
		t.Errorf("outside CI: failed %q, skipped %q; want a skip naming the plugin and how to enable it", r.failed, r.skipped)
	}
	t.Setenv("CI", "true")
	r = &recorder{}
	SkipOrFail(r, "missing plugin", msg)
	if r.failed != msg || r.skipped != "" {
		t.Errorf("in CI: failed %q, skipped %q; want a failure", r.failed, r.skipped)
	}
}

func TestBuffer(t *testing.T) {
	var b Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			_, _ = b.Write([]byte("a line\n"))
		}
	}()
	_, _ = b.Write([]byte("the other\n"))
	<-done
	if got := len(b.Lines("line")); got != 100 {
		t.Fatalf("%d lines with %q, want 100", got, "line")
	}
	if got := b.Lines("other"); len(got) != 1 || got[0] != "the other" {
		t.Fatalf("Lines(other) = %q", got)
	}
}
