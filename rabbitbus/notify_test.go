package rabbitbus

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// amqp091 drops a confirm or a return it cannot hand to the publisher
// within 5 seconds (its channel full). A confirm loop starved of
// processor time that long (a loaded machine) must still get every
// return: one dropped reports an unroutable message routed, which loses
// a retry whose retry queue is gone. More messages than the window are
// published to an exchange no queue is bound to while the loop stalls
// for longer than that: every one must fail as unroutable.
func TestStarvedConfirmLoopMissesNoReturn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := open(ctx, t, "mandatory=true")
	dc := c.Driver().(*conn)
	topic := "omnibus-starved-" + strings.ToLower(omnibus.NewID())
	if err := dc.CreateTopic(ctx, topic, 0); err != nil {
		t.Fatal(err)
	}

	var once sync.Once
	stall := func() { once.Do(func() { time.Sleep(6 * time.Second) }) }
	starve.Store(&stall)
	defer starve.Store(nil)

	n := 2 * window
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: "m-" + strconv.Itoa(i), Body: []byte("x")}
	}
	err := dc.Publish(ctx, topic, msgs, driver.PublishOptions{Durability: driver.DurabilityAll})
	var me *driver.MessageErrors
	if !errors.As(err, &me) {
		t.Fatalf("Publish: %v, want each message to fail as unroutable", err)
	}
	var routed []string
	for i, err := range me.Errs {
		if !errors.Is(err, ErrUnroutable) {
			routed = append(routed, msgs[i].ID+": "+strings.TrimSpace(errString(err)))
		}
	}
	if len(routed) > 0 {
		t.Fatalf("%d of %d unroutable messages not reported unroutable, e.g. %v", len(routed), n, routed[:min(3, len(routed))])
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil> (reported routed)"
	}
	return err.Error()
}
