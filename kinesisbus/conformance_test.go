package kinesisbus_test

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

func TestConformance(t *testing.T) {
	// kinesalite cannot be restarted with its data (in memory), has no
	// ack deadline, and a group's state is its lease table, which
	// without its checkpoints would be a new group (DeleteGroup).
	need(t)
	url := testURL("")
	transporttest.Run(t, transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, url)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return c
		},
		Lanes: 4,
	})
}
