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
// asserted. Nothing is skipped silently.
//
// Delivery tests count unique message IDs: none may be lost, and
// duplicates are allowed only where the guarantee allows them.
package transporttest
