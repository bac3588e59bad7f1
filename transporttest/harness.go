package transporttest

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
)

// Harness is what a transport hands the suite.
type Harness struct {
	// Open returns a new client to the transport. The suite calls it
	// several times per test (publishers and consumers use separate
	// clients, as separate processes would) and closes what it opens.
	Open func(ctx context.Context, t testing.TB) *omnibus.Client

	// Lanes is the number of lanes the suite asks for when it creates a
	// topic (Client.CreateTopic). Default: 4. Transports whose lane count
	// is fixed by the URL set it to that count.
	Lanes int

	// Restart, when set, restarts the server (and waits until it is back).
	// The reconnect test runs only with it, and says so when skipped.
	Restart func(ctx context.Context, t testing.TB)
}
