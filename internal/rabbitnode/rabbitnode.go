// Package rabbitnode runs a RabbitMQ node of a test's own: a second
// broker on the machine, with its own node name, ports, data and
// configuration in a temporary directory, so that a test can stop,
// restart or kill it without touching the server other tests share. It
// needs the rabbitmq-server package installed (the node runs its
// rabbitmq-server script in the foreground) and the machine's epmd.
package rabbitnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Where the rabbitmq-server script is looked for: the Debian package's
// own, which runs as the caller (the /usr/sbin wrapper switches to the
// rabbitmq user), then PATH.
var scripts = []string{"/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server"}

// bootTimeout bounds a node's start: a cold boot takes 5-15 s on a
// loaded two-core machine.
const bootTimeout = 90 * time.Second

// Node is a RabbitMQ node of the test's own. Its methods are safe for
// concurrent use; Start, Stop, Kill and Restart wait for the node.
type Node struct {
	t       testing.TB
	script  string
	dir     string
	name    string
	port    int
	env     []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// Start starts a node for t, with the consistent-hash exchange plugin
// enabled and the guest user allowed from loopback, and stops it when t
// ends. Without rabbitmq-server it fails in CI and skips elsewhere.
func Start(t testing.TB) *Node {
	t.Helper()
	script := ""
	for _, s := range scripts {
		if p, err := exec.LookPath(s); err == nil {
			script = p
			break
		}
	}
	if script == "" {
		testenv.SkipOrFail(t, "missing rabbitmq-server", "a test's own RabbitMQ node needs rabbitmq-server (apt-get install rabbitmq-server)")
	}
	dir, err := os.MkdirTemp("", "omnibus-rabbitnode-")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{
		t:      t,
		script: script,
		dir:    dir,
		name:   fmt.Sprintf("omnibus-%x@localhost", rand.Uint32()),
		port:   freePort(t),
	}
	dist := freePort(t)
	files := map[string]string{
		"rabbitmq.conf":     fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\nloopback_users = none\nlog.file.level = warning\n", n.port),
		"enabled_plugins":   "[rabbitmq_consistent_hash_exchange].\n",
		"rabbitmq-env.conf": "", // not the machine's, which names the shared node
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n.logPath = filepath.Join(dir, "stdout.log")
	n.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir, // the Erlang cookie
		"LANG=C.UTF-8",
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_NODENAME=" + n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + filepath.Join(dir, "plugins"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
	t.Cleanup(func() {
		n.Stop()
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("rabbitnode: the node's files are kept in %s", dir)
		}
	})
	n.Start()
	return n
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// URL is the node's AMQP URL (user guest), with query appended when not
// empty.
func (n *Node) URL(query string) string {
	u := "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(n.port) + "/"
	if query != "" {
		u += "?" + query
	}
	return u
}

// Addr is the node's AMQP address.
func (n *Node) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Start boots the node (again, with the same data) and waits until it
// speaks AMQP. It fails the test when the node does not come up.
func (n *Node) Start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return
	}
	out, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(n.script)
	cmd.Env = n.env
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	// A group of its own: the script runs the Erlang VM as its child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		n.t.Fatalf("rabbitnode: start %s: %v", n.script, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(done)
	}()
	n.cmd, n.done = cmd, done
	for !speaksAMQP(n.Addr()) {
		select {
		case <-done:
			n.cmd = nil
			n.t.Fatalf("rabbitnode: node %s exited while booting: %s\n%s", n.name, cmd.ProcessState, n.tail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Since(start) > bootTimeout {
			n.t.Fatalf("rabbitnode: node %s did not answer on %s within %v:\n%s", n.name, n.Addr(), bootTimeout, n.tail())
		}
	}
	n.t.Logf("rabbitnode: node %s up on %s after %v", n.name, n.Addr(), time.Since(start).Round(time.Millisecond))
}

// Stop stops the node gracefully (SIGTERM: the broker closes its
// connections and writes its state) and waits for it; after 60 s it is
// killed.
func (n *Node) Stop() { n.stop(syscall.SIGTERM, time.Minute) }

// Kill kills the node's processes at once (SIGKILL), as a crash or a
// power cut would, and waits for them.
func (n *Node) Kill() { n.stop(syscall.SIGKILL, 0) }

// Restart stops the node gracefully and starts it again.
func (n *Node) Restart() {
	n.t.Helper()
	n.Stop()
	n.Start()
}

func (n *Node) stop(sig syscall.Signal, grace time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	pid := n.cmd.Process.Pid
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // the script and the VM
	} else {
		_ = syscall.Kill(pid, sig) // the script stops the VM and waits for it
	}
	select {
	case <-n.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-n.done
	}
	// The VM is the script's child: make sure it is gone, so that its
	// ports are free for the next start.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && syscall.Kill(-pid, 0) == nil; {
		time.Sleep(50 * time.Millisecond)
	}
	n.cmd = nil
}

// tail is the end of the node's output, for a failure.
func (n *Node) tail() string {
	b, _ := os.ReadFile(n.logPath)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// speaksAMQP reports whether addr answers the AMQP 0-9-1 protocol header
// with a connection.start frame: the broker is up, not just its port.
func speaksAMQP(addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return false
	}
	head := make([]byte, 7)
	if _, err := io.ReadFull(c, head); err != nil {
		return false
	}
	return head[0] == 1 && bytes.Equal(head[1:3], []byte{0, 0}) // a method frame on channel 0
}
