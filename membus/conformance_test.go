package membus_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

var busSeq atomic.Int64

// TestConformance runs the suite on a bus of its own. membus has no ack
// deadline, no group state apart from the bus, and commits that do not
// fail: the harness declares none of the hooks that need them.
func TestConformance(t *testing.T) {
	transporttest.Run(t, harness(t))
}

// TestFaults runs the fault suite: the rebalance storm. A bus lives in
// its process: it has no URL for other processes and no server to
// restart, and those tests say so.
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, harness)
}

func harness(*testing.T) transporttest.Harness {
	name := fmt.Sprintf("mem://conformance-%d", busSeq.Add(1))
	return transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			// Clients opened with the same name share one bus.
			c, err := omnibus.Open(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
	}
}
