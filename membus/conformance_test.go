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
