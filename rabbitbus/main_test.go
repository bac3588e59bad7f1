package rabbitbus

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestMain silences the engine's logs (injected handler failures log a
// stack each) unless RABBITBUS_LOG is set.
func TestMain(m *testing.M) {
	if os.Getenv("RABBITBUS_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}
