package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Environment of a child process of the cross-process tests.
const (
	childDir   = "NATSBUS_CHILD_DIR"   // the embedded server's directory
	childTopic = "NATSBUS_CHILD_TOPIC" // where to publish
	childN     = "NATSBUS_CHILD_N"     // how many messages, one publish each
	childEvery = "NATSBUS_CHILD_EVERY" // pause between publishes
)

// TestEmbeddedChildProcess is the child of the cross-process tests: it
// opens the embedded URL of a directory, publishes, and prints which
// process ran the server when it finished.
func TestEmbeddedChildProcess(t *testing.T) {
	dir := os.Getenv(childDir)
	if dir == "" {
		t.Skip("the child process of TestEmbeddedAcrossProcesses")
	}
	n, _ := strconv.Atoi(os.Getenv(childN))
	every, _ := time.ParseDuration(os.Getenv(childEvery))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := omnibus.Open(ctx, natsbus.EmbeddedURL(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range n {
		if err := c.Publish(ctx, os.Getenv(childTopic), &omnibus.Message{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		time.Sleep(every)
	}
	pid, _ := natsbus.EmbeddedOwner(c.Driver())
	fmt.Printf("server-pid=%d\n", pid)
}

// child runs TestEmbeddedChildProcess and returns the process that ran
// the server it ended on.
func child(t *testing.T, dir, topic string, n int, every time.Duration) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmbeddedChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childDir+"="+dir, childTopic+"="+topic, childN+"="+strconv.Itoa(n), childEvery+"="+every.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("child: %v\n%s", err, out)
		return 0
	}
	_, after, ok := strings.Cut(string(out), "server-pid=")
	pid, err := strconv.Atoi(strings.Fields(after + " x")[0])
	if !ok || err != nil {
		t.Errorf("child printed no server-pid:\n%s", out)
	}
	return pid
}

// streamMessages returns how many messages the server at url holds for
// topic.
func streamMessages(t *testing.T, url, topic string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, topic)
	if err != nil {
		t.Fatalf("stream of %q: %v", topic, err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestEmbeddedAcrossProcesses: while a process runs the embedded server
// of a directory, another process that opens the same directory uses
// that server (its messages land in the same stream), and no second
// server starts on the directory: StartServer says which process holds
// it.
func TestEmbeddedAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	c := transporttest.Open(t, natsbus.EmbeddedURL(dir))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Publish(ctx, "shared", &omnibus.Message{Body: []byte("parent")}); err != nil {
		t.Fatal(err)
	}
	if pid := child(t, dir, "shared", 5, 0); pid != os.Getpid() {
		t.Errorf("the child ended on the server of process %d, want this one (%d)", pid, os.Getpid())
	}
	_, url := natsbus.EmbeddedOwner(c.Driver())
	if got := streamMessages(t, url, "shared"); got != 6 {
		t.Errorf("the stream holds %d messages, want 6 (1 from this process, 5 from the child)", got)
	}
	_, err := natsbus.StartServer(ctx, natsbus.ServerConfig{Dir: dir})
	if !errors.Is(err, natsbus.ErrDirInUse) || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Errorf("StartServer on a directory in use = %v, want ErrDirInUse naming process %d", err, os.Getpid())
	}
}

// TestEmbeddedTakeover: processes that come and go on one directory
// share one server at a time: when the process running it ends, one of
// the others starts it and the rest follow, and every message published
// meanwhile is stored once.
func TestEmbeddedTakeover(t *testing.T) {
	dir := t.TempDir()
	const children, n = 3, 40
	var wg sync.WaitGroup
	pids := make([]int, children)
	for i := range children {
		wg.Go(func() {
			// Staggered, so the first ends (and takes its server along)
			// while the others still publish.
			time.Sleep(time.Duration(i) * 400 * time.Millisecond)
			pids[i] = child(t, dir, "takeover", n, 25*time.Millisecond)
		})
	}
	wg.Wait()
	if pids[0] == pids[children-1] {
		t.Errorf("all children ended on the server of process %d: no takeover happened", pids[0])
	}
	c := transporttest.Open(t, natsbus.EmbeddedURL(dir))
	_, url := natsbus.EmbeddedOwner(c.Driver())
	if got := streamMessages(t, url, "takeover"); got != children*n {
		t.Errorf("the stream holds %d messages, want %d", got, children*n)
	}
}
