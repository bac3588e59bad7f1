package redisbus_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// childEnv holds, for a child member of the crash test, its URL, topic
// and group, tab separated (see runChild).
const childEnv = "REDISBUS_CRASH_CHILD"

// crashHandle is every member's handling time in the crash test: slow
// enough that the child is killed with messages in its hands.
const crashHandle = 2 * time.Millisecond

// runChild is a group member in a process of its own: it handles
// messages of the topic in the group and writes each handled ID to
// stdout, one line each, before the handler returns, so every message it
// acknowledged is written. It runs until it is killed.
func runChild() int {
	args := strings.Split(os.Getenv(childEnv), "\t")
	if len(args) != 3 {
		fmt.Fprintf(os.Stderr, "%s: want URL, topic and group, tab separated\n", childEnv)
		return 2
	}
	ctx := context.Background()
	c, err := omnibus.Open(ctx, args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	k, err := c.Subscribe(ctx, args[1], func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(crashHandle)
		mu.Lock()
		defer mu.Unlock()
		_, err := os.Stdout.WriteString(m.ID + "\n")
		return err
	}, omnibus.Group(args[2]), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(16))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := k.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// handled is what the members of the crash test handled, by message ID.
type handled struct {
	mu       sync.Mutex
	byParent map[string]int
	byChild  map[string]int
	claimed  int            // deliveries with Attempt > 1 (claimed from the dead member)
	lastOf   map[string]int // per key, the index of the newest message the parent handled
	disorder []string
}

func newHandled() *handled {
	return &handled{byParent: map[string]int{}, byChild: map[string]int{}, lastOf: map[string]int{}}
}

func (h *handled) parent(m *omnibus.Message) {
	i, _ := strconv.Atoi(strings.TrimPrefix(m.ID, "m-"))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byParent[m.ID]++
	if m.Attempt > 1 {
		h.claimed++
	}
	if last, ok := h.lastOf[m.Key]; ok && i < last && len(h.disorder) < 5 {
		h.disorder = append(h.disorder, fmt.Sprintf("%s (key %s) after m-%05d", m.ID, m.Key, last))
	}
	h.lastOf[m.Key] = max(h.lastOf[m.Key], i)
}

func (h *handled) child(id string) {
	h.mu.Lock()
	h.byChild[id]++
	h.mu.Unlock()
}

// unique counts the IDs handled by anyone.
func (h *handled) unique() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.byParent)
	for id := range h.byChild {
		if h.byParent[id] == 0 {
			n++
		}
	}
	return n
}

// TestCrash kills a member (a child process) with SIGKILL while it holds
// messages: the group's other members must handle everything it did not
// acknowledge, unpartitioned through XAUTOCLAIM after claim_idle, and
// partitioned once its leases expire; 20,000 messages, counting unique
// IDs, none lost. Partitioned, the survivors must also keep each key's
// order.
func TestCrash(t *testing.T) {
	u := serverURL(t)
	for _, mode := range []struct{ name, params string }{
		{"Unpartitioned", "claim_idle=2s"},
		{"Partitioned", "claim_idle=2s&partitions=6&lease_ttl=2s&rebalance_interval=100ms"},
	} {
		t.Run(mode.name, func(t *testing.T) { testCrash(t, with(u, mode.params)) })
	}
}

func testCrash(t *testing.T, rawURL string) {
	const total, keys = 20000, 64
	ctx := context.Background()
	topic := topicName(t, rawURL)
	const group = "crash"
	pub := transporttest.Open(t, rawURL)
	if err := pub.CreateTopic(ctx, topic, 6); err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 100))
	for i := 0; i < total; i += 500 {
		ms := make([]*omnibus.Message, 500)
		for j := range ms {
			ms[j] = &omnibus.Message{ID: fmt.Sprintf("m-%05d", i+j), Key: "k" + strconv.Itoa((i+j)%keys), Body: body}
		}
		if err := pub.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
	}
	h := newHandled()

	child := exec.Command(os.Args[0], "-test.run=^$")
	// The child's consumers are named child-<ID>, so the test can tell
	// what is pending for it.
	child.Env = append(os.Environ(), childEnv+"="+rawURL+"&name=child\t"+topic+"\t"+group)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.child(sc.Text())
		}
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	waitFor(t, 30*time.Second, func() bool { return h.unique() >= 500 }, "the child handled nothing")

	// Two members in this process join the group.
	for range 2 {
		k, err := transporttest.Open(t, rawURL).Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			time.Sleep(crashHandle)
			h.parent(m)
			return nil
		}, omnibus.Group(group), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(16))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
	}
	waitFor(t, 60*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.byParent) >= 1000 && len(h.byChild) >= 2000
	}, "the members did not get going")

	// Kill the child without letting it close: what it holds stays
	// pending for its consumer.
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killed = true
	<-read
	h.mu.Lock()
	byChild := len(h.byChild)
	h.mu.Unlock()
	pending := pendingOf(t, rawURL, topic, group, "child-")
	t.Logf("child killed after handling %d messages, %d entries pending for it", byChild, pending)
	if pending == 0 {
		t.Fatalf("nothing was pending for the child when it was killed: the test proves nothing")
	}

	waitFor(t, 90*time.Second, func() bool { return h.unique() == total }, "not every message was handled")
	waitFor(t, 30*time.Second, func() bool { return pendingOf(t, rawURL, topic, group, "child-") == 0 },
		"entries are still pending for the dead member")
	h.mu.Lock()
	defer h.mu.Unlock()
	var lost []string
	dups := 0
	for i := range total {
		id := fmt.Sprintf("m-%05d", i)
		n := h.byParent[id] + h.byChild[id]
		if n == 0 {
			lost = append(lost, id)
		}
		dups += max(0, n-1)
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d lost, first %v", len(lost), total, lost[:min(5, len(lost))])
	}
	if h.claimed == 0 {
		t.Errorf("no delivery came with Attempt > 1: the dead member's entries were not claimed from it")
	}
	if strings.Contains(rawURL, "partitions=") && len(h.disorder) > 0 {
		t.Errorf("key order broken among the surviving members: %v", h.disorder)
	}
	t.Logf("%d unique IDs handled (%d by the child, %d by the survivors), %d handled twice, %d claimed with Attempt > 1",
		total, byChild, len(h.byParent), dups, h.claimed)
}

// pendingOf counts the entries pending in group on topic's streams for
// the consumers whose names start with prefix.
func pendingOf(t testing.TB, rawURL, topic, group, prefix string) int64 {
	t.Helper()
	rdb := raw(t, rawURL)
	ctx := context.Background()
	streams := []string{topic}
	if n, err := rdb.Get(ctx, topic+":partitions").Int(); err == nil {
		streams = streams[:0]
		for p := range n {
			streams = append(streams, topic+":"+strconv.Itoa(p))
		}
	}
	var total int64
	for _, st := range streams {
		p, err := rdb.XPending(ctx, st, group).Result()
		if err != nil {
			t.Fatalf("XPENDING %s %s: %v", st, group, err)
		}
		for name, n := range p.Consumers {
			if strings.HasPrefix(name, prefix) {
				total += n
			}
		}
	}
	return total
}

// waitFor polls cond every 20ms for up to d, and fails t with msg when it
// does not hold by then.
func waitFor(t testing.TB, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
