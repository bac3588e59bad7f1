package nsqbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestOrderRefused: NSQ keeps no order and no history, so the engine's
// ordered modes and a start from the earliest message are refused with
// a *CapabilityError at Subscribe, never weakened; OrderNone, the
// default here, runs.
func TestOrderRefused(t *testing.T) {
	c := transporttest.Open(t, directURL(t))
	caps := c.Capabilities()
	if caps.Ordered || caps.Replay || caps.ExclusiveLanes || !caps.Groups || caps.Lag != driver.LagDepth {
		t.Errorf("capabilities %+v, want unordered lanes, no replay, groups, depth lag", caps)
	}
	h := func(context.Context, *omnibus.Message) error { return nil }
	for name, opt := range map[string]omnibus.SubscribeOption{
		"OrderKey":      omnibus.Order(omnibus.OrderKey),
		"OrderLane":     omnibus.Order(omnibus.OrderLane),
		"StartEarliest": omnibus.StartFrom(omnibus.StartEarliest),
	} {
		_, err := c.Subscribe(context.Background(), "refused", h, opt)
		var ce *omnibus.CapabilityError
		if !errors.As(err, &ce) || !errors.Is(err, omnibus.ErrUnsupported) || !strings.Contains(err.Error(), "nsq") {
			t.Errorf("%s: got %v, want a *CapabilityError naming the nsq transport", name, err)
		}
	}
	k, err := c.Subscribe(context.Background(), "refused", h)
	if err != nil {
		t.Fatalf("Subscribe with the default order: %v", err)
	}
	_ = k.Close()
	deleteTopic(t, "refused")
}
