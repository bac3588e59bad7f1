package kafkabus_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// franz-go's warnings reach the client's logger, naming the transport.
func TestClientLibraryLogs(t *testing.T) {
	cluster := newCluster(t)
	var mu sync.Mutex
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return b.Write(p)
	}), nil))
	c, err := omnibus.Open(ctxT(t), clusterURL(cluster, "create_topics=all&request_timeout=1s"), omnibus.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cluster.Close() // every broker gone: the client warns as it fails to connect
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = c.Publish(ctx, "logs", &omnibus.Message{Body: []byte("x")})
	mu.Lock()
	defer mu.Unlock()
	if out := b.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "transport=kafka") {
		t.Errorf("no franz-go warning naming the transport in the client's log:\n%.2000s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
