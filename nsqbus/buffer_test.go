package nsqbus_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestOutputBuffer: with output_buffer_timeout nsqd holds a lone message
// on a quiet topic until its timer fires, which shows the parameter
// reaches nsqd; the same consumer without it (the default, no buffer,
// which TestParseConfig shows go-nsq asks for) gets the message well
// before. The timer starts when the consumer connects (before Subscribe
// returns), so a message published at once waits about the whole
// timeout.
func TestOutputBuffer(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	for _, tc := range []struct {
		param    string
		buffered bool
	}{{"", false}, {fmt.Sprintf("output_buffer_timeout=%s", timeout), true}} {
		t.Run(fmt.Sprintf("buffered=%v", tc.buffered), func(t *testing.T) {
			t.Parallel()
			c := transporttest.Open(t, directURL(t, tc.param))
			topic := fmt.Sprintf("buffer-%x", rand.Uint32())
			t.Cleanup(func() { deleteTopic(t, topic) })
			got := make(chan time.Time, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
				got <- time.Now()
				return nil
			}, omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- k.Run(ctx) }()
			sent := time.Now()
			if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			var wait time.Duration
			select {
			case at := <-got:
				wait = at.Sub(sent)
			case <-time.After(2 * timeout):
				t.Fatal("no message")
			}
			if tc.buffered && wait < timeout/2 {
				t.Errorf("buffered: the message came after %v, before nsqd's %v timer could fire", wait, timeout)
			}
			if !tc.buffered && wait >= timeout/2 {
				t.Errorf("unbuffered: the message came after %v", wait)
			}
			cancel()
			if err := <-ran; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// TestOutputBufferRefused: buffer settings the URL takes but nsqd does
// not (a timeout under its --min-output-buffer-timeout, a size over its
// --max-output-buffer-size) fail Open with nsqd's reason, naming the
// setting, rather than a consumer that never connects.
func TestOutputBufferRefused(t *testing.T) {
	t.Parallel()
	for p, reason := range map[string]string{
		"output_buffer_timeout=1ms":    "output buffer timeout",
		"output_buffer_size=100000000": "output buffer size",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := omnibus.Open(ctx, directURL(t, p))
		cancel()
		if err == nil {
			_ = c.Close()
			t.Errorf("%s: Open succeeded", p)
			continue
		}
		if !strings.Contains(err.Error(), reason) {
			t.Errorf("%s: Open: %v; want nsqd's reason, %q", p, err, reason)
		}
	}
}
