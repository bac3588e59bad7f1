package transporttest

// Messages published again: the IDs of messages a client published again
// after an unknown outcome (its PublishRetryHook), on transports that
// store such a message twice when the first try had landed
// (Harness.ResendsStoredTwice), so that collectors allow those copies and
// nothing else. The hook runs on publishing goroutines; resent is read by
// collectors' checks. Message IDs are unique, so one record serves every
// test of the process.

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/omnibus-go/omnibus"
)

var (
	resentMu sync.Mutex
	resent   = map[string]int{} // message ID -> times published again after an unknown outcome
)

// storesTwice holds the names of the Run calls whose harness declared
// ResendsStoredTwice.
var storesTwice sync.Map // test name -> true

// RecordResends returns the hook a harness whose transport stores a
// message published again twice (Harness.ResendsStoredTwice) installs on
// every client its Open returns, with omnibus.WithHooks: it records the
// messages the client publishes again after an error marked
// ErrOutcomeUnknown, which the suite then allows to be handled again.
func RecordResends() omnibus.Hook { return resendRecorder{} }

type resendRecorder struct{}

// OnPublishRetry records p's messages when they are published again after
// an unknown outcome; a publish tried again after ErrRetryable (the server
// cannot have acted) stores nothing twice.
func (resendRecorder) OnPublishRetry(p omnibus.PublishRetry) {
	if !errors.Is(p.Err, omnibus.ErrOutcomeUnknown) {
		return
	}
	resentMu.Lock()
	defer resentMu.Unlock()
	for _, id := range p.IDs {
		resent[id]++
	}
}

// resends is how many times message id was published again after an
// unknown outcome.
func resends(id string) int {
	resentMu.Lock()
	defer resentMu.Unlock()
	return resent[id]
}

// storesResendsTwice reports whether t runs under a Run whose harness
// declared ResendsStoredTwice.
func storesResendsTwice(t testing.TB) bool {
	twice := false
	storesTwice.Range(func(name, _ any) bool {
		n := name.(string)
		twice = t.Name() == n || strings.HasPrefix(t.Name(), n+"/")
		return !twice
	})
	return twice
}

// copiesAllowed is how many deliveries of message id after its first t
// allows as copies of its publishes again (none unless t's harness
// declared ResendsStoredTwice).
func copiesAllowed(t testing.TB, id string) int {
	if !storesResendsTwice(t) {
		return 0
	}
	return resends(id)
}
