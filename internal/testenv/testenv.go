// Package testenv lets integration tests find the servers they need and
// fail loudly when one is missing in CI.
package testenv

import (
	"net"
	"os"
	"testing"
	"time"
)

// InCI reports whether the tests run under CI (the CI variable is set),
// where a missing server is a failure, not a skip.
func InCI() bool { return os.Getenv("CI") != "" }

// Require checks that a server listens on addr (host:port). When it does
// not, the test fails in CI and is skipped elsewhere; both say how to
// start the server.
func Require(t testing.TB, name, addr, howToStart string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		_ = conn.Close()
		return
	}
	msg := name + " is not reachable at " + addr + " (" + err.Error() + "); start it with: " + howToStart + " (or run scripts/test.sh, which starts it)"
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip("SKIP (missing server): " + msg)
}

// Getenv returns the environment variable key, or def when it is unset.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
