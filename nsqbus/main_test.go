package nsqbus_test

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/omnibus-go/omnibus/internal/nsqtest"
)

// TestMain runs nsqd or nsqlookupd when the test binary was started as
// one (see nsqtest), and otherwise the tests, with the engine's logs
// silenced (injected handler failures log a stack each) unless
// NSQBUS_LOG is set. The servers the tests shared stop at the end.
func TestMain(m *testing.M) {
	nsqtest.Main()
	if os.Getenv("NSQBUS_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	code := m.Run()
	stopShared()
	os.Exit(code)
}
