package rabbitbus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// alarmProxy relays AMQP connections between clients and the test server
// and can play a server in a memory or disk alarm without touching the
// shared server's configuration. While the alarm is on, a connection that
// publishes is blocked as RabbitMQ blocks it: the proxy stops reading from
// it at its next basic.publish (so the client's writes stall once the
// socket buffers are full) and, unless the alarm is silent, sends it
// connection.blocked (and connection.unblocked when the alarm ends).
// Connections that only consume go on, as on RabbitMQ.
type alarmProxy struct {
	relay testenv.Relay

	mu     sync.Mutex
	alarm  chan struct{} // non-nil while an alarm is on; closed when it ends
	notify bool          // the alarm sends connection.blocked

	held atomic.Int32 // connections the alarm holds
}

func startProxy(t testing.TB) *alarmProxy {
	t.Helper()
	requireServer(t)
	p := &alarmProxy{}
	p.relay.Read = readFrame
	p.relay.Chunk = func(c *testenv.RelayConn, dir testenv.Dir, f []byte) {
		if dir == testenv.ToServer && isPublish(f) {
			p.hold(c)
		}
	}
	p.relay.Start(t, testAddr)
	t.Cleanup(p.end) // before the relay's cleanup closes it
	return p
}

func (p *alarmProxy) url(params string) string {
	return "amqp://guest:guest@" + p.relay.Addr() + "/?" + params
}

// start raises an alarm; notify says whether blocked connections are told.
func (p *alarmProxy) start(notify bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.alarm == nil {
		p.alarm, p.notify = make(chan struct{}), notify
	}
}

// end clears the alarm: held connections go on.
func (p *alarmProxy) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.alarm != nil {
		close(p.alarm)
		p.alarm = nil
	}
}

// hold blocks the relay of what c's client sends, and with it the
// client's connection, while an alarm is on.
func (p *alarmProxy) hold(c *testenv.RelayConn) {
	p.mu.Lock()
	alarm, notify := p.alarm, p.notify
	p.mu.Unlock()
	if alarm == nil {
		return
	}
	if notify {
		_ = c.Send(testenv.ToClient, methodFrame(10, 60, append([]byte{byte(len("low on memory"))}, "low on memory"...)))
	}
	p.held.Add(1)
	select {
	case <-alarm:
	case <-p.relay.Done():
	}
	p.held.Add(-1)
	if notify {
		_ = c.Send(testenv.ToClient, methodFrame(10, 61, nil))
	}
}

// readFrame reads the next AMQP frame, whole, from r: a frame, or the
// protocol header a client starts with ("AMQP" 0 0 9 1).
func readFrame(r io.Reader) ([]byte, error) {
	hdr := make([]byte, 7, 64)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	if string(hdr[:4]) == "AMQP" {
		f := append(hdr, 0)
		if _, err := io.ReadFull(r, f[7:]); err != nil {
			return nil, err
		}
		return f, nil
	}
	size := binary.BigEndian.Uint32(hdr[3:7])
	f := append(hdr, make([]byte, size+1)...)
	if _, err := io.ReadFull(r, f[7:]); err != nil {
		return nil, err
	}
	return f, nil
}

// isPublish reports whether frame f is a basic.publish method frame.
func isPublish(f []byte) bool {
	return len(f) >= 11 && f[0] == 1 && binary.BigEndian.Uint16(f[7:9]) == 60 && binary.BigEndian.Uint16(f[9:11]) == 40
}

// methodFrame encodes a method frame on channel 0.
func methodFrame(class, method uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, class)
	payload = binary.BigEndian.AppendUint16(payload, method)
	payload = append(payload, args...)
	f := []byte{1, 0, 0}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	f = append(f, payload...)
	return append(f, 0xCE)
}

// within runs fn on a goroutine and returns how long it took and its
// error, or ok false when it has not returned after limit (fn then goes
// on; it must not touch t).
func within(limit time.Duration, fn func() error) (took time.Duration, ok bool, err error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return time.Since(start), true, err
	case <-time.After(limit):
		return limit, false, nil
	}
}

// During a memory or disk alarm the server blocks every connection that
// publishes. Publish must still return at its context's deadline (with
// the context's error), a second publisher must not queue behind the
// first past its own deadline, the dead-letter path must let its
// consumer close, and Client.Close must return promptly; once the alarm
// ends the same connection publishes again.
func TestPublishHonoursContextWhileBlocked(t *testing.T) {
	for _, tt := range []struct {
		name   string
		notify bool
	}{{"connection.blocked", true}, {"silent stall", false}} {
		t.Run(tt.name, func(t *testing.T) {
			const deadline = time.Second
			const slack = 4 * time.Second // a loaded machine
			p := startProxy(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := openURL(ctx, t, p.url("heartbeat=60s"))
			t.Cleanup(p.end) // before the client's cleanup closes it
			topic := "omnibus-alarm-" + strings.ToLower(omnibus.NewID())

			var handled sync.Map
			alarmOn := make(chan struct{})
			k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
				if m.ID == "poison" {
					select {
					case <-alarmOn:
					case <-ctx.Done():
					}
					return omnibus.Permanent(errors.New("poison"))
				}
				handled.Store(m.ID, true)
				return nil
			}, omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			go func() { _ = k.Run(rctx) }()
			if err := c.Publish(ctx, topic, &omnibus.Message{ID: "before", Body: []byte("x")}, &omnibus.Message{ID: "poison", Body: []byte("x")}); err != nil {
				t.Fatalf("Publish before the alarm: %v", err)
			}
			transporttest.Eventually(t, 30*time.Second, func() bool { _, ok := handled.Load("before"); return ok }, func() string { return "nothing handled before the alarm" })

			p.start(tt.notify)
			// publish publishes ms with the deadline and checks that it
			// returns then, with the context's error.
			publish := func(what string, ms ...*omnibus.Message) {
				took, ok, err := within(deadline+slack+5*time.Second, func() error {
					pctx, pcancel := context.WithTimeout(ctx, deadline)
					defer pcancel()
					return c.Publish(pctx, topic, ms...)
				})
				t.Logf("%s: %v after %v", what, err, took)
				switch {
				case !ok:
					t.Errorf("%s still blocked %v after its %v deadline", what, took-deadline, deadline)
				case !errors.Is(err, context.DeadlineExceeded) || took > deadline+slack:
					t.Errorf("%s returned %v after %v; want the context's deadline error after about %v", what, err, took, deadline)
				}
			}
			// A batch larger than the socket buffers: its writes block.
			big := make([]*omnibus.Message, 24)
			for i := range big {
				big[i] = &omnibus.Message{ID: fmt.Sprintf("big-%d", i), Body: make([]byte, 512<<10)}
			}
			bigDone := make(chan struct{})
			go func() {
				defer close(bigDone)
				publish("Publish of a large batch", big...)
			}()
			transporttest.Eventually(t, 10*time.Second, func() bool { return p.held.Load() > 0 }, func() string { return "the proxy never held a publish" })
			publish("a second Publish, while the first is stuck", &omnibus.Message{ID: "small", Body: []byte("x")})
			<-bigDone

			// The dead-letter path publishes during the alarm; closing the
			// consumer ends it.
			close(alarmOn)
			time.Sleep(200 * time.Millisecond) // the handler fails and the dead letter goes out
			took, ok, _ := within(slack+5*time.Second, k.Close)
			t.Logf("Consumer.Close with a dead letter in flight: %v", took)
			if !ok || took > slack {
				t.Errorf("Consumer.Close with a dead letter in flight took %v (returned: %v); want under %v", took, ok, slack)
			}

			p.end()
			pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
			defer pcancel()
			if err := c.Publish(pctx, topic, &omnibus.Message{ID: "after", Body: []byte("x")}); err != nil {
				t.Errorf("Publish after the alarm: %v", err)
			}

			// Close during an alarm, with a publish stuck.
			p.start(tt.notify)
			go func() {
				pctx, pcancel := context.WithTimeout(ctx, time.Minute)
				defer pcancel()
				_ = c.Publish(pctx, topic, big...)
			}()
			transporttest.Eventually(t, 10*time.Second, func() bool { return p.held.Load() > 0 }, func() string { return "the proxy never held a publish" })
			time.Sleep(200 * time.Millisecond)
			took, ok, _ = within(slack+5*time.Second, c.Close)
			t.Logf("Client.Close during the alarm: %v", took)
			if !ok || took > slack {
				t.Errorf("Client.Close during an alarm took %v (returned: %v); want under %v", took, ok, slack)
			}
		})
	}
}
