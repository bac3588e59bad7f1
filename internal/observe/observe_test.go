package observe

import (
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// A lag in milliseconds (Kinesis) is a time: it has no count of messages,
// whatever Known says, and keeps its age.
func TestFromLagMillisIsNoCount(t *testing.T) {
	l := omnibus.LaneLag{Lane: "shard-0", Lag: 10323, Known: true, Age: 10 * time.Second, AgeKnown: true}
	got := FromLag(l, driver.LagMillis)
	if got.MessagesKnown {
		t.Errorf("a lag of %d ms was reported as a count of messages", l.Lag)
	}
	if !got.SecondsKnown || got.Seconds != 10 {
		t.Errorf("age = %v (known %v), want 10 s", got.Seconds, got.SecondsKnown)
	}
	for _, kind := range []driver.LagKind{driver.LagRecords, driver.LagDepth} {
		if got := FromLag(l, kind); !got.MessagesKnown || got.Messages != l.Lag {
			t.Errorf("kind %v: count %d (known %v), want %d", kind, got.Messages, got.MessagesKnown, l.Lag)
		}
	}
}
