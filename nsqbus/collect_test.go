package nsqbus_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// collector counts the unique message IDs handled, and redeliveries.
type collector struct {
	mu   sync.Mutex
	seen map[string]int
}

func newCollector() *collector { return &collector{seen: map[string]int{}} }

func (c *collector) add(id string) {
	c.mu.Lock()
	c.seen[id]++
	c.mu.Unlock()
}

func (c *collector) handle(_ context.Context, m *omnibus.Message) error {
	c.add(m.ID)
	return nil
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// missing returns the IDs of ids not seen.
func (c *collector) missing(ids []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var miss []string
	for _, id := range ids {
		if c.seen[id] == 0 {
			miss = append(miss, id)
		}
	}
	return miss
}

// dups is the number of deliveries beyond the first of each ID.
func (c *collector) dups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.seen {
		n += k - 1
	}
	return n
}

// awaitAll waits until every one of ids was handled by one of cs.
func awaitAll(t *testing.T, d time.Duration, ids []string, cs ...*collector) {
	t.Helper()
	var miss []string
	transporttest.Eventually(t, d, func() bool {
		miss = ids
		for _, c := range cs {
			miss = c.missing(miss)
		}
		return len(miss) == 0
	}, func() string {
		return fmt.Sprintf("%d of %d messages never handled, e.g. %v", len(miss), len(ids), miss[:min(5, len(miss))])
	})
}

// numbered returns n messages with IDs prefix-00000 ... and a body of
// size bytes.
func numbered(prefix string, from, n, size int) []*omnibus.Message {
	body := make([]byte, size)
	ms := make([]*omnibus.Message, n)
	for i := range ms {
		ms[i] = &omnibus.Message{ID: prefix + "-" + strconv.Itoa(from+i), Body: body}
	}
	return ms
}
