package transporttest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// failRecorder is a testing.TB whose Fatalf records its message and
// ends the goroutine, as testing's does, without failing the test.
type failRecorder struct {
	testing.TB
	msg string
}

func (r *failRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestOpenRedacts: an Open that fails names the URL, its password and
// secret parameters hidden, as test logs are logs too.
func TestOpenRedacts(t *testing.T) {
	for _, url := range []string{
		"nosuch://user:hunter2@127.0.0.1:1/",
		"kafka://127.0.0.1:1?sasl=plain&user=u&password=hunter2&nosuch=1",
	} {
		rec := &failRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Open(rec, url)
		}()
		<-done
		switch {
		case rec.msg == "":
			t.Errorf("Open(%q) did not fail", strings.ReplaceAll(url, "hunter2", "…"))
		case strings.Contains(rec.msg, "hunter2"):
			t.Errorf("the failure shows the password: %s", strings.ReplaceAll(rec.msg, "hunter2", "[the password]"))
		default:
			t.Logf("failure: %s", rec.msg)
		}
	}
}
