package rabbitbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestPublishReturnedWhileStuck: a Publish that returns at its context's
// deadline while its write is stuck on a connection the server stopped
// reading (a silent alarm) leaves its messages to the caller: the caller
// writes over their bodies at once, the alarm ends, and every message
// that lands is one as it was published, byte for byte (those of the
// Publish that returned at most once, as its outcome is unknown).
func TestPublishReturnedWhileStuck(t *testing.T) {
	p := startProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := openURL(ctx, t, p.url("heartbeat=60s"))
	t.Cleanup(p.end) // before the client's cleanup closes it
	topic := "omnibus-stuck-" + strings.ToLower(omnibus.NewID())

	var mu sync.Mutex
	got := map[string][][]byte{}
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		got[m.ID] = append(got[m.ID], bytes.Clone(m.Body))
		mu.Unlock()
		return nil
	}, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	landed := func(id string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got[id]) > 0
		}
	}
	published := map[string][]byte{}
	message := func(id string, size int) *omnibus.Message {
		body := bytes.Repeat([]byte(id+"."), size/(len(id)+1))
		published[id] = bytes.Clone(body)
		return &omnibus.Message{ID: id, Body: body}
	}
	if err := c.Publish(ctx, topic, message("before", 10)); err != nil {
		t.Fatalf("Publish before the alarm: %v", err)
	}
	transporttest.Eventually(t, 30*time.Second, landed("before"), func() string { return "nothing handled before the alarm" })

	p.start(false)
	// A batch larger than the socket buffers: a write stalls halfway.
	big := make([]*omnibus.Message, 24)
	for i := range big {
		big[i] = message(fmt.Sprintf("big-%d", i), 512<<10)
	}
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	if err := c.Publish(pctx, topic, big...); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish during the alarm: %v, want the context's deadline error", err)
	}
	if p.held.Load() == 0 {
		t.Fatal("the proxy held no publish: the batch was not stuck")
	}
	for _, m := range big {
		for i := range m.Body {
			m.Body[i] = 'X'
		}
	}
	p.end()
	if err := c.Publish(ctx, topic, message("after", 10)); err != nil {
		t.Fatalf("Publish after the alarm: %v", err)
	}
	transporttest.Eventually(t, 30*time.Second, landed("after"), func() string { return "the message published after the alarm was not handled" })

	mu.Lock()
	defer mu.Unlock()
	n := 0
	for id, bodies := range got {
		want, ok := published[id]
		switch {
		case !ok:
			t.Errorf("message %q, not published, was handled", id)
		case len(bodies) > 1:
			t.Errorf("message %q handled %d times", id, len(bodies))
		}
		for _, b := range bodies {
			if !bytes.Equal(b, want) {
				x := bytes.Count(b, []byte("X"))
				t.Errorf("message %q landed with a body of %d bytes, %d of them written over after its Publish returned; published as %d bytes", id, len(b), x, len(want))
			}
		}
		if strings.HasPrefix(id, "big-") {
			n++
		}
	}
	t.Logf("%d of %d messages of the Publish that returned landed", n, len(big))
}
