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
	// without its checkpoints would be a new group (DeleteGroup). It
	// takes seconds over a few MiB of records (their bodies base64'd
	// twice), so the suite's largest messages are kept to 64 KiB
	// (max_message_bytes); TestLargestMessage sends one of the default
	// limit. Kinesis keeps no message IDs: a publish omnibus sends again
	// after an unknown outcome (no answer from kinesalite) stores the
	// messages twice when the first try had landed, and the suite allows
	// those copies, recorded by its hook, and nothing else.
	need(t)
	t.Parallel()
	url := testURL("max_message_bytes=65536")
	transporttest.Run(t, transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, url, omnibus.WithHooks(transporttest.RecordResends()))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return c
		},
		Lanes:              4,
		ResendsStoredTwice: true,
	})
}
