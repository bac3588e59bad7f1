package transporttest

// Child processes for the fault tests: a consumer running in a process
// of its own (the test binary again, told by its environment to be one),
// which the test kills with SIGKILL, or which crashes by itself in a
// handler. The child prints a line per message it handled; the parent
// reads them on a goroutine per child (ended when the child's output
// closes) and counts them in a ledger (guarded by its mutex).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// childEnv, set in a child's environment, holds its childSpec as JSON.
const childEnv = "OMNIBUS_TRANSPORTTEST_CHILD"

// headerPoison marks a message whose handler crashes its process.
const headerPoison = "poison"

// childSpec is what a child consumes and how.
type childSpec struct {
	URL         string
	Topic       string
	Group       string
	MaxInFlight int
	MaxAttempts int
	Earliest    bool
}

// runChild is the child process: it consumes as spec says and prints
// "ready" once subscribed, then "handled <id> <key> <seq> <attempt>" per
// message handled and "poison <id> <attempt>" before it crashes on a
// poisoned one (exit status 3). It stops gracefully when its standard
// input closes.
func runChild(raw string) {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child: bad spec:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := omnibus.Open(ctx, spec.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		line := fmt.Sprintf(format+"\n", args...)
		mu.Lock()
		_, _ = os.Stdout.WriteString(line) // one write: a kill cuts no line
		mu.Unlock()
	}
	h := func(_ context.Context, m *omnibus.Message) error {
		if m.Headers[headerPoison] != "" {
			say("poison %s %d", m.ID, m.Attempt)
			os.Exit(3) // as a handler that crashes its process
		}
		say("handled %s %s %s %d", m.ID, orDash(m.Key), orDash(m.Headers[headerSeq]), m.Attempt)
		return nil
	}
	opts := []omnibus.SubscribeOption{omnibus.Group(spec.Group), omnibus.MaxInFlight(spec.MaxInFlight), omnibus.MaxAttempts(spec.MaxAttempts)}
	if spec.Earliest {
		opts = append(opts, omnibus.StartFrom(omnibus.StartEarliest))
	}
	k, err := c.Subscribe(ctx, spec.Topic, h, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: subscribe:", err)
		os.Exit(2)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	say("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "child: run:", err)
	}
	_ = c.Close()
	os.Exit(0)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// child is a child process as the parent sees it.
type child struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr testenv.Buffer
	ready  chan struct{}
	done   chan struct{} // closed once the process exited and its output is read
	err    error         // its exit status, once done
}

// testPattern is the -test.run pattern that runs exactly the test named
// name (a test and its parents, "TestFaults/partitioned").
func testPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// startChild starts a consumer process of spec, running the test named
// base (the one that called RunFaults) of this test binary, and feeds
// its lines to l. It is killed at cleanup if still running.
func startChild(t testing.TB, base, name string, spec childSpec, l *ledger) *child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, name: name, ready: make(chan struct{}), done: make(chan struct{})}
	c.cmd = exec.Command(exe, "-test.run="+testPattern(base), "-test.count=1", "-test.timeout=0")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", name, err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 1 && f[0] == "ready":
				close(c.ready)
			case len(f) == 5 && f[0] == "handled":
				seq, _ := strconv.ParseInt(f[3], 10, 64)
				attempt, _ := strconv.Atoi(f[4])
				l.add(f[1], undash(f[2]), seq, attempt, name)
			case len(f) == 3 && f[0] == "poison":
				attempt, _ := strconv.Atoi(f[2])
				l.poisoned(f[1], attempt)
			}
		}
		c.err = c.cmd.Wait()
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

func undash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// awaitReady waits until the child subscribed, and fails the test when
// it exited first or took longer than d.
func (c *child) awaitReady(d time.Duration) {
	c.t.Helper()
	select {
	case <-c.ready:
	case <-c.done:
		c.t.Fatalf("child %s exited before it subscribed (%v):\n%s", c.name, c.err, c.stderr.String())
	case <-time.After(d):
		c.t.Fatalf("child %s did not subscribe within %v:\n%s", c.name, d, c.stderr.String())
	}
}

// kill kills the child at once (SIGKILL) and waits for it.
func (c *child) kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop asks the child to stop gracefully and waits up to d for it; it
// is killed after that, failing the test.
func (c *child) stop(d time.Duration) {
	c.t.Helper()
	_ = c.stdin.Close()
	select {
	case <-c.done:
		if c.err != nil {
			c.t.Errorf("child %s: %v\n%s", c.name, c.err, c.stderr.String())
		}
	case <-time.After(d):
		c.kill()
		c.t.Errorf("child %s did not stop within %v:\n%s", c.name, d, c.stderr.String())
	}
}

// exitCode is the child's exit status once it ended: -1 when killed by
// a signal.
func (c *child) exitCode() int {
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		return -1
	}
	return 0
}
