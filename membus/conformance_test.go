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
	transporttest.Run(t, transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			// One bus per top-level run: clients opened with the same name share it.
			c, err := omnibus.Open(ctx, fmt.Sprintf("mem://conformance-%d", busSeq.Load()))
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
	})
}
