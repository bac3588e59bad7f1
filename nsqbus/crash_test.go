package nsqbus_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Environment of the crash test's child member.
const (
	childURL   = "NSQBUS_CHILD_URL"
	childTopic = "NSQBUS_CHILD_TOPIC"
	childGroup = "NSQBUS_CHILD_GROUP"
)

// childStall is how many messages the crash test's child handles before
// every other handler stops returning: from then on it holds some of
// what nsqd sends it, in flight when it is killed, and goes on handling
// the rest.
const childStall = 2000

// TestCrashChild is the member the crash test kills: it consumes with
// the group and writes the ID of every message its handler finished to
// stdout before the handler returns, so the parent knows what it handled
// even if the FIN never went out. The write is a system call per message,
// unbuffered: an ID still in a buffer when the kill comes would be a
// message this member finished (and FINed) that the parent never hears
// of, and counts as lost. After childStall messages every other handler
// blocks until the kill.
func TestCrashChild(t *testing.T) {
	u := os.Getenv(childURL)
	if u == "" {
		t.Skip("the child process of TestCrashedMember")
	}
	ctx := context.Background()
	c, err := omnibus.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	k, err := c.Subscribe(ctx, os.Getenv(childTopic), func(ctx context.Context, m *omnibus.Message) error {
		if n := handled.Add(1); n > childStall && n%2 == 1 {
			select {} // held in flight until the kill
		}
		time.Sleep(time.Millisecond)
		_, err := os.Stdout.WriteString(m.ID + "\n") // one write, shorter than PIPE_BUF: never interleaved
		return err
	}, omnibus.Group(os.Getenv(childGroup)), omnibus.MaxInFlight(256))
	if err != nil {
		t.Fatal(err)
	}
	_ = k.Run(ctx) // until killed
}

// TestCrashedMember kills a member of a group (SIGKILL, a child process
// that never closes) while it holds messages in flight and handles
// others (every other handler blocks after childStall messages, and it
// is killed 1,000 messages later): nsqd delivers them again after msg_timeout, and the
// members left handle them. Over 20,000 messages, every ID is handled,
// by the dead member before it died or by the others.
func TestCrashedMember(t *testing.T) {
	const total, msgTimeout = 20000, 2 * time.Second
	u := directURL(t, "msg_timeout="+msgTimeout.String())
	topic := fmt.Sprintf("crash-%x", rand.Uint32())
	pub := transporttest.Open(t, u)
	t.Cleanup(func() { deleteTopic(t, topic) })

	// The survivor: two members of the group in this process.
	mine := newCollector()
	var redelivered atomic.Int64
	k, err := transporttest.Open(t, u).Subscribe(context.Background(), topic, func(ctx context.Context, m *omnibus.Message) error {
		if m.Attempt > 1 {
			redelivered.Add(1)
		}
		return mine.handle(ctx, m)
	}, omnibus.Group("crash"), omnibus.Members(2), omnibus.MaxInFlight(64))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)

	// The member that dies.
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childURL+"="+u, childTopic+"="+topic, childGroup+"=crash")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	theirs := newCollector()
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			theirs.add(sc.Text())
		}
	}()

	ctx := context.Background()
	var ids []string
	killed, stalledAt := false, -1
	for i := 0; i < total; i += 100 {
		ms := numbered("crash", i, 100, 100)
		if err := pub.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		if stalledAt < 0 && theirs.unique() >= childStall {
			stalledAt = i
		}
		if !killed && stalledAt >= 0 && i >= stalledAt+1000 {
			// Mid-stream, with messages in its buffer and handlers.
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	if !killed {
		time.Sleep(time.Second) // the child had not joined in time: give it a share now
		if theirs.unique() == 0 {
			t.Fatal("the child member handled nothing")
		}
		_ = cmd.Process.Kill()
	}
	_ = cmd.Wait()
	<-read
	awaitAll(t, 90*time.Second, ids, mine, theirs)
	t.Logf("%d messages: %d handled by the killed member, %d by the others (%d of them delivered again after the kill, %d duplicates here)",
		total, theirs.unique(), mine.unique(), redelivered.Load(), mine.dups())
	if redelivered.Load() == 0 {
		t.Errorf("no message came back after the kill: the member held nothing in flight, so the test proved nothing")
	}
}
