// Package transporttest is the conformance suite every omnibus transport
// runs. A transport's conformance_test.go hands it a [Harness]:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, transporttest.Harness{
//			Open: func(ctx context.Context, t testing.TB) *omnibus.Client { ... },
//		})
//	}
//
// Each subtest checks one guarantee against the real transport, on a fresh
// topic named after the test. The suite reads the transport's declared
// capabilities: a guarantee the transport does not claim is skipped with a
// message that names the missing capability, and one it claims is
// asserted. Tests that need more from the harness than Open (restarting
// the server, deleting a group's state, refusing commits, an ack
// deadline) are skipped, naming the missing field, when the harness
// leaves it unset. Nothing is skipped silently.
//
// Delivery tests count unique message IDs: none may be lost, and
// duplicates are allowed only where the test injects a fault (a server
// restart, a deleted group, a handler slower than the ack deadline);
// elsewhere, graceful hand-overs included, a message handled twice fails
// the test. One exception, declared by the harness
// (Harness.ResendsStoredTwice): on a transport that keeps no message IDs,
// a message the publisher published again after an unknown outcome may
// be stored and handled twice; the suite allows exactly those copies, of
// the messages its hook (RecordResends) saw published again.
//
// On ordered transports, key order means: no message of a key is handled
// after a newer message of that key was settled (its handler returned
// nil), redeliveries included; the same message again right after it was
// settled is a duplicate, not a break of order.
//
// Hostile tests drive what users get wrong and servers do behind a
// consumer's back: handlers slower than the ack deadline, a group's
// server-side state deleted, dead-letter topics that refuse a message,
// observers and handlers that call the consumer back, handlers that
// ignore their context, a key that keeps failing, a lane revoked while
// others stay, lanes handed over again and again on an idle topic (each
// handover within seconds, not the DrainTimeout a revocation waiting for
// a Receive nobody wakes would take). A call that must not block runs with a bound; one that
// hangs fails the test with the stacks of the goroutines the test
// started, and the suite goes on.
//
// A transport whose connection removes topics and groups ([Remover])
// tests that in a test of its own, which reads with its raw client what
// the server keeps: [ConsumeSome] gives the server a topic with messages
// and a group with state on it, [Remove] removes them twice through the
// connection.
//
// A transport's own tests run their consumers with [RunConsumer], as the
// suite does: stopped gracefully at cleanup, and failing the test when
// Run returns an error or does not return.
package transporttest
