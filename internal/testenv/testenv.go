// Package testenv lets integration tests find the servers they need and
// fail loudly when one is missing in CI. Relay puts a loopback proxy
// between a test's clients and their server, for the hostile tests that
// hold back or cut what passes.
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
	SkipOrFail(t, "missing server", name+" is not reachable at "+addr+" ("+err.Error()+"); start it with: "+howToStart+" (or run scripts/test.sh, which starts it)")
}

// SkipOrFail ends a test that cannot run here because of what (a missing
// server, a plugin that is not enabled): it fails in CI and is skipped
// elsewhere, saying why and what to do.
func SkipOrFail(t testing.TB, what, msg string) {
	t.Helper()
	if InCI() {
		t.Fatal(msg)
		return
	}
	t.Skip("SKIP (" + what + "): " + msg)
}

// EnableHashPlugin is how to enable the RabbitMQ plugin that the
// transport's partitioned mode needs.
const EnableHashPlugin = "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"

// Getenv returns the environment variable key, or def when it is unset.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
