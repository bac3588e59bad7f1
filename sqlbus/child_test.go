package sqlbus_test

// Child processes: the test binary started again as a relay or as an
// instance of the bank service, so that tests can kill them with
// SIGKILL, as a crash would, at any point.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// childConfig is what a child process is told, as JSON in SQLBUS_CHILD.
type childConfig struct {
	Role      string // "relay" or "bank"
	Driver    string
	DSN       string
	Dialect   sqlbus.Dialect
	Prefix    string
	BusURL    string
	Namespace string
	Notify    bool
}

// child runs this process as a child when SQLBUS_CHILD says so, and
// reports whether it did; a child runs until it is killed or its
// parent's end closes its standard input.
func child() bool {
	raw := os.Getenv("SQLBUS_CHILD")
	if raw == "" {
		return false
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child: config:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { // the parent went away: stop
		_, _ = os.Stdin.Read(make([]byte, 1))
		stop()
	}()
	if err := runChild(ctx, cfg); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// childConns bounds a child's connections: fewer than its handlers
// running at once, so they also wait for a connection.
const childConns = 6

func runChild(ctx context.Context, cfg childConfig) error {
	db, err := sql.Open(cfg.Driver, cfg.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	// A bounded pool, as a service would have: unbounded, the handlers
	// of two scenarios' children at once took PostgreSQL past its
	// max_connections of 100 ("sorry, too many clients already").
	db.SetMaxOpenConns(childConns)
	st, err := sqlbus.Open(ctx, db, cfg.Dialect, sqlbus.Prefix(cfg.Prefix))
	if err != nil {
		return err
	}
	c, err := omnibus.Open(ctx, cfg.BusURL)
	if err != nil {
		return err
	}
	defer c.Close()
	switch cfg.Role {
	case "relay":
		r, err := sqlbus.NewRelay(st, c, sqlbus.Poll(20*time.Millisecond), sqlbus.Notify(cfg.Notify), sqlbus.BatchSize(20))
		if err != nil {
			return err
		}
		return r.Run(ctx)
	case "bank":
		return runBank(ctx, st, c, cfg)
	}
	return fmt.Errorf("unknown role %q", cfg.Role)
}

var (
	childOnce sync.Once
	childBin  string
)

// childBinary is the program child processes run: this test binary, or
// under the race detector the same tests built without it (go test -c),
// so that the child processes, many at once on a small machine, run at
// production speed. The parent's goroutines are still checked for
// races, and the same code runs in-process under the detector in the
// other tests. Without a go command the race-enabled binary is used.
func childBinary(t testing.TB) string {
	childOnce.Do(func() {
		childBin = os.Args[0]
		if !raceEnabled {
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			return
		}
		dir, err := os.MkdirTemp("", "sqlbus-child")
		if err != nil {
			return
		}
		out := filepath.Join(dir, "sqlbus.test")
		if b, err := exec.Command(goBin, "test", "-c", "-o", out, ".").CombinedOutput(); err != nil {
			t.Logf("building the child binary without the race detector: %v\n%s", err, b)
			return
		}
		childBin = out
	})
	return childBin
}

// proc is a child process the test started.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser // kept: the child stops when it closes
	stderr *bytes.Buffer
	ready  chan struct{} // closed when the child prints "ready"
	done   chan struct{}
}

// children starts and kills child processes of a test; Cleanup kills
// those left.
type children struct {
	t      testing.TB
	mu     sync.Mutex
	procs  map[string]*proc
	kills  int
	killed map[int]time.Time // killed processes' IDs: when they were killed
}

func newChildren(t testing.TB) *children {
	cs := &children{t: t, procs: map[string]*proc{}, killed: map[int]time.Time{}}
	t.Cleanup(func() {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		for name, p := range cs.procs {
			_ = p.cmd.Process.Kill()
			<-p.done
			if t.Failed() && p.stderr.Len() > 0 {
				t.Logf("child %s stderr:\n%s", name, tail(p.stderr.String(), 3000))
			}
		}
	})
	return cs
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// start starts child name with cfg.
func (cs *children) start(name string, cfg childConfig) {
	cs.t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(childBinary(cs.t), "-test.run=^$")
	cmd.Env = append(os.Environ(), "SQLBUS_CHILD="+string(raw))
	p := &proc{cmd: cmd, stderr: &bytes.Buffer{}, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &syncWriter{w: p.stderr}
	if os.Getenv("SQLBUS_LOG") != "" {
		cmd.Stderr = os.Stderr
	}
	stdin, err := cmd.StdinPipe() // closed when the parent ends
	if err != nil {
		cs.t.Fatal(err)
	}
	p.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cs.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cs.t.Fatalf("start child %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(p.ready)
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	cs.mu.Lock()
	cs.procs[name] = p
	cs.mu.Unlock()
}

// waitReady waits until child name said it is ready, or ended.
func (cs *children) waitReady(name string, d time.Duration) {
	cs.t.Helper()
	cs.mu.Lock()
	p := cs.procs[name]
	cs.mu.Unlock()
	select {
	case <-p.ready:
	case <-p.done:
		cs.t.Fatalf("child %s ended before it was ready:\n%s", name, tail(p.stderr.String(), 3000))
	case <-time.After(d):
		cs.t.Fatalf("child %s not ready after %v:\n%s", name, d, tail(p.stderr.String(), 3000))
	}
}

// kill kills child name with SIGKILL and waits for it to end.
func (cs *children) kill(name string) {
	cs.mu.Lock()
	p := cs.procs[name]
	delete(cs.procs, name)
	cs.kills++
	cs.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	cs.mu.Lock()
	cs.killed[p.cmd.Process.Pid] = time.Now()
	cs.mu.Unlock()
}

// killedAt returns when process pid was killed, if it was.
func (cs *children) killedAt(pid int) (time.Time, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	t, ok := cs.killed[pid]
	return t, ok
}

// exited returns the output of a child that ended by itself, if any.
func (cs *children) exited() (string, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for name, p := range cs.procs {
		select {
		case <-p.done:
			return fmt.Sprintf("child %s exited (%v):\n%s", name, p.cmd.ProcessState, tail(p.stderr.String(), 3000)), true
		default:
		}
	}
	return "", false
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}
