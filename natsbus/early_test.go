package natsbus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// ackProxy relays NATS connections to a server and, while it holds,
// passes nothing from the server to the clients (publish acks among it)
// while the clients' messages go through.
type ackProxy struct {
	relay testenv.Relay

	mu   sync.Mutex
	held chan struct{} // non-nil while holding; closed when it ends
}

func startAckProxy(t *testing.T, server string) *ackProxy {
	t.Helper()
	p := &ackProxy{}
	p.relay.Chunk = func(_ *testenv.RelayConn, dir testenv.Dir, chunk []byte) {
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if dir == testenv.ToClient && chunk != nil && held != nil {
			select {
			case <-held:
			case <-p.relay.Done():
			}
		}
	}
	p.relay.Start(t, server)
	t.Cleanup(p.release) // before the relay's cleanup closes it
	return p
}

func (p *ackProxy) url() string { return "nats://" + p.relay.Addr() }

func (p *ackProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

func (p *ackProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// TestPublishReturnedBeforeAcks: a Publish that returns when its context
// ends while the server's acks are held leaves its messages to the
// caller: the caller writes over their bodies and headers at once and
// publishes others, the acks come, and every message in the stream is
// one as published, byte for byte (those of the Publish that returned at
// most once, the others exactly once).
func TestPublishReturnedBeforeAcks(t *testing.T) {
	server := externalURL(t)
	p := startAckProxy(t, strings.TrimPrefix(server, "nats://"))
	// A window of 10: of the publish that returns, some messages are
	// waiting for their acks, the others for room in the window.
	c := transporttest.Open(t, p.url()+"?publish_window=10")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := topicName(t, server)

	published := map[string][]byte{}
	messages := func(prefix string, n int) []*omnibus.Message {
		ms := make([]*omnibus.Message, n)
		for i := range ms {
			id := fmt.Sprintf("%s-%d", prefix, i)
			body := bytes.Repeat([]byte(id+"."), 2000/(len(id)+1))
			published[id] = bytes.Clone(body)
			ms[i] = &omnibus.Message{ID: id, Body: body, Headers: map[string]string{"n": id}}
		}
		return ms
	}
	if err := c.Publish(ctx, topic, messages("warm", 1)...); err != nil {
		t.Fatalf("Publish before the acks are held: %v", err)
	}

	p.hold()
	early := messages("early", 50)
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer pcancel()
	if err := c.Publish(pctx, topic, early...); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish while the acks are held: %v, want the context's deadline error", err)
	}
	for _, m := range early {
		for i := range m.Body {
			m.Body[i] = 'X'
		}
		m.Headers["n"] = "overwritten"
		m.ID = "overwritten"
	}
	later := messages("later", 50)
	done := make(chan error, 1)
	go func() { done <- c.Publish(ctx, topic, later...) }()
	p.release()
	if err := <-done; err != nil {
		t.Fatalf("Publish after: %v", err)
	}

	// Read the stream back on a connection of the test's own.
	stream, err := rawJetStream(t, server).Stream(ctx, natsbus.StreamName(topic))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		got[id]++
		want, ok := published[id]
		switch {
		case !ok:
			t.Errorf("message %q, not published, is in the stream", id)
		case !bytes.Equal(m.Data, want) || m.Header.Get("ce-n") != id:
			t.Errorf("message %s is in the stream as %.40q…, header %q; published as %.40q…", id, m.Data, m.Header.Get("ce-n"), want)
		}
	}
	for _, m := range later {
		if got[m.ID] != 1 {
			t.Errorf("message %s is in the stream %d times, want 1", m.ID, got[m.ID])
		}
	}
	n := 0
	for i := range early {
		id := fmt.Sprintf("early-%d", i)
		if got[id] > 1 {
			t.Errorf("message %s is in the stream %d times", id, got[id])
		}
		n += got[id]
	}
	t.Logf("%d of %d messages of the Publish that returned are in the stream", n, len(early))
}
