package transporttest

// The harness: what a transport hands the suite, and the hooks a test
// needs beyond Open (a restart, a deleted group, refused commits, an ack
// deadline). Its functions run on the test's goroutine.

import (
	"context"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Harness is what a transport hands the suite. Open is required; every
// other field is optional, and a test that needs a missing one is skipped
// with a message naming it.
type Harness struct {
	// Open returns a new client to the transport. The suite calls it
	// several times per test (publishers and consumers use separate
	// clients, as separate processes would) and closes what it opens.
	Open func(ctx context.Context, t testing.TB) *omnibus.Client

	// URL is the URL Open connects with, for RunFaults's child processes
	// (consumers the tests kill, or that crash): they open it with
	// omnibus.Open in a process of their own. Transports whose state
	// lives in the test's process (membus) leave it empty, and those
	// tests are skipped, naming it.
	URL string

	// Gaps names the fault tests (RunFaults: "ConsumerKilled",
	// "ServerRestart", "RebalanceStorm", "PoisonCrashesItsProcess") the
	// transport cannot pass yet, each with the known defect that fails
	// it; those tests are skipped, naming it. A defect is said where it
	// is: in the harness, the package documentation and
	// docs/RELIABILITY.md.
	Gaps map[string]string

	// ResendsStoredTwice declares that the transport cannot drop a message
	// Client.Publish publishes again after an unknown outcome (an error
	// marked ErrOutcomeUnknown: no answer came, or the server failed on
	// its side, maybe after storing it): it keeps no message IDs, so the
	// copy is stored beside the first try when that had landed (Kinesis).
	// The tests then allow those messages, and only those, to be handled
	// once more per time they were published again, the copy also after
	// newer messages of its key (it lands behind what was published
	// since). The suite knows them from the hook [RecordResends] returns,
	// which Open must then install on every client (omnibus.WithHooks);
	// without it, no copy is allowed. Every other duplicate still fails
	// a test that allows none.
	ResendsStoredTwice bool

	// Lanes is the number of lanes the suite asks for when it creates a
	// topic (Client.CreateTopic). Default: 4. Transports whose lane count
	// is fixed by the URL set it to that count.
	Lanes int

	// Restart, when set, restarts the server (and waits until it is back).
	// The reconnect test runs only with it, and says so when skipped.
	Restart func(ctx context.Context, t testing.TB)

	// AckDeadline is how long the server waits for a delivery to be
	// settled before it delivers the message again, as the clients Open
	// returns are configured (NATS: ack_wait, set in the URL). Transports
	// without such a deadline, or with one far beyond a test's length (a
	// RabbitMQ server's consumer_timeout), leave it zero, and the
	// slow-handler tests are skipped, naming it.
	AckDeadline time.Duration

	// DeleteGroup, when set, deletes what the server keeps of consumer
	// group on topic, behind its members' backs, as an operator or an
	// inactivity expiry would, and leaves the topic's messages in place
	// (NATS: the group's durable consumer, or every partition's
	// consumer). Transports where the group's state cannot go without its
	// messages (a RabbitMQ queue), or is nothing but a position that a
	// group without it does not have (Kafka's committed offsets), leave it
	// nil; the test is then skipped, naming it.
	DeleteGroup func(ctx context.Context, t testing.TB, topic, group string)

	// FailCommits, when set, makes the server refuse every commit of
	// positions from now on, until the returned function is called
	// (Kafka: OffsetCommit requests fail). The test that Shutdown reports
	// a failed final commit runs only with it; transports whose
	// settlement cannot be made to fail from outside leave it nil, and
	// the engine's own tests cover the report.
	FailCommits func(t testing.TB) (restore func())
}
