// Package nsqtest runs nsqd and nsqlookupd for tests, from the nsq
// module's own packages, so nothing needs installing: each server is a
// child process of the test binary (the binary started again with an
// environment variable that Main reads), on loopback ports of its own,
// keeping its data in a directory of its own. A child process, not a
// goroutine, so that a server can be stopped and started again on its
// data directory, and so that its goroutines do not count as the
// tests' (the conformance suite looks for leaked goroutines).
//
// A package using it calls Main first thing in its TestMain:
//
//	func TestMain(m *testing.M) {
//		nsqtest.Main()
//		os.Exit(m.Run())
//	}
//
// The parent's side of a server (NSQD, Lookupd) is safe for concurrent
// use; a child ends when the parent does.
package nsqtest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment of a child process.
const (
	envRole   = "OMNIBUS_NSQTEST_ROLE"   // "nsqd" or "nsqlookupd"
	envConfig = "OMNIBUS_NSQTEST_CONFIG" // the child's config, JSON
)

// Config is what an nsqd is started with. The zero value is nsqd's
// defaults.
type Config struct {
	// MsgTimeout is nsqd's --msg-timeout, the default time a message may
	// stay in flight before nsqd delivers it again. Default: 60s.
	MsgTimeout time.Duration
	// MaxMsgSize is nsqd's --max-msg-size. Default: 1 MiB.
	MaxMsgSize int64
	// MemQueueSize is nsqd's --mem-queue-size, the messages a topic or
	// channel keeps in memory before it writes to disk. Default: 10000.
	MemQueueSize int64
	// Lookupd is the nsqlookupd the server registers with, if any.
	Lookupd *Lookupd
	// AuthHTTPAddress is nsqd's --auth-http-address: the server asks it
	// whether a client's secret may publish and subscribe.
	AuthHTTPAddress string
}

// child is the configuration a child process reads from envConfig.
type child struct {
	TCP, HTTP       int
	Dir             string
	MsgTimeout      time.Duration
	MaxMsgSize      int64
	MemQueueSize    int64
	LookupdTCP      string
	AuthHTTPAddress string
}

// Main runs the server this process was started as, and exits when it
// ends; in any other process it returns at once. Call it first in
// TestMain.
func Main() {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	var cfg child
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "nsqtest: %s config: %v\n", role, err)
		os.Exit(2)
	}
	var err error
	switch role {
	case "nsqd":
		err = runNSQD(cfg)
	case "nsqlookupd":
		err = runLookupd(cfg)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nsqtest: %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// process is a child process running one server.
type process struct {
	role string
	cfg  child

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// start starts the child and waits until its TCP port answers.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	raw, err := json.Marshal(p.cfg)
	if err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(p.cfg.Dir, p.role+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+p.role, envConfig+"="+string(raw))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("nsqtest: start %s: %w", p.role, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	addr := net.JoinHostPort(loopback, strconv.Itoa(p.cfg.TCP))
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-done:
			return fmt.Errorf("nsqtest: %s exited at start: %s", p.role, p.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("nsqtest: %s did not listen on %s within 30s: %s", p.role, addr, p.logTail())
		}
	}
	p.cmd, p.done = cmd, done
	return nil
}

// stop ends the child: gracefully (SIGTERM: nsqd writes what it holds
// in memory to its data directory) or not (SIGKILL). It waits for the
// process to exit.
func (p *process) stop(graceful bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	if graceful {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	} else {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd, p.done = nil, nil
}

// logTail is the end of the child's log, for errors.
func (p *process) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.cfg.Dir, p.role+".log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

const loopback = "127.0.0.1"

// freePorts returns two free loopback ports, the second the first + 1,
// as NSQ's conventions have them (4150 and 4151, 4160 and 4161).
func freePorts() (int, int, error) {
	for range 100 {
		l, err := net.Listen("tcp", loopback+":0")
		if err != nil {
			return 0, 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", net.JoinHostPort(loopback, strconv.Itoa(p+1)))
		_ = l.Close()
		if err == nil {
			_ = l2.Close()
			return p, p + 1, nil
		}
	}
	return 0, 0, errors.New("nsqtest: no two free consecutive ports")
}

// NSQD is an nsqd child process. Its ports and data directory stay the
// same across Stop and Start.
type NSQD struct {
	p process
}

// StartNSQD starts an nsqd for t, in a temporary directory of t's; it
// is stopped when t ends.
func StartNSQD(t testing.TB, cfg Config) *NSQD {
	t.Helper()
	n, err := Start(t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// Start starts an nsqd keeping its data in dir (which must exist), on
// free loopback ports: HTTP on the TCP port + 1. The caller calls Close.
func Start(dir string, cfg Config) (*NSQD, error) {
	tcp, web, err := freePorts()
	if err != nil {
		return nil, err
	}
	c := child{TCP: tcp, HTTP: web, Dir: dir, MsgTimeout: cfg.MsgTimeout, MaxMsgSize: cfg.MaxMsgSize, MemQueueSize: cfg.MemQueueSize,
		AuthHTTPAddress: cfg.AuthHTTPAddress}
	if cfg.Lookupd != nil {
		c.LookupdTCP = cfg.Lookupd.TCPAddr()
	}
	n := &NSQD{p: process{role: "nsqd", cfg: c}}
	if err := n.p.start(); err != nil {
		return nil, err
	}
	return n, nil
}

// TCPAddr is the address clients connect to (host:port).
func (n *NSQD) TCPAddr() string { return net.JoinHostPort(loopback, strconv.Itoa(n.p.cfg.TCP)) }

// HTTPAddr is the address of the HTTP API (host:port).
func (n *NSQD) HTTPAddr() string { return net.JoinHostPort(loopback, strconv.Itoa(n.p.cfg.HTTP)) }

// URL is the nsq:// URL of the server, with the query parameters given
// ("msg_timeout=1s", ...).
func (n *NSQD) URL(params ...string) string {
	u := "nsq://" + n.TCPAddr()
	if len(params) > 0 {
		u += "?" + strings.Join(params, "&")
	}
	return u
}

// CPU is the processor time the server's process has used since it
// started (user and system), read from /proc; 0 where there is no
// /proc or the server is stopped.
func (n *NSQD) CPU() time.Duration {
	n.p.mu.Lock()
	cmd := n.p.cmd
	n.p.mu.Unlock()
	if cmd == nil {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// After the command name in parentheses: state is field 3, utime
	// and stime fields 14 and 15, in clock ticks of 1/100 s.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Dir is the server's data directory.
func (n *NSQD) Dir() string { return n.p.cfg.Dir }

// Stop stops the server gracefully: nsqd writes the messages it holds
// in memory, in flight included, to its data directory.
func (n *NSQD) Stop() { n.p.stop(true) }

// Kill stops the server at once, as a crash would.
func (n *NSQD) Kill() { n.p.stop(false) }

// Start starts the server again, on the same ports and data directory.
func (n *NSQD) Start() error { return n.p.start() }

// Close stops the server; it is idempotent.
func (n *NSQD) Close() { n.p.stop(true) }

// Lookupd is an nsqlookupd child process.
type Lookupd struct {
	p process
}

// StartLookupd starts an nsqlookupd for t; it is stopped when t ends.
func StartLookupd(t testing.TB) *Lookupd {
	t.Helper()
	l, err := StartLookupdIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// StartLookupdIn starts an nsqlookupd writing its log in dir, on free
// loopback ports: HTTP on the TCP port + 1. The caller calls Close.
func StartLookupdIn(dir string) (*Lookupd, error) {
	tcp, web, err := freePorts()
	if err != nil {
		return nil, err
	}
	l := &Lookupd{p: process{role: "nsqlookupd", cfg: child{TCP: tcp, HTTP: web, Dir: dir}}}
	if err := l.p.start(); err != nil {
		return nil, err
	}
	return l, nil
}

// TCPAddr is the address nsqd registers with.
func (l *Lookupd) TCPAddr() string { return net.JoinHostPort(loopback, strconv.Itoa(l.p.cfg.TCP)) }

// HTTPAddr is the address consumers look topics up at.
func (l *Lookupd) HTTPAddr() string { return net.JoinHostPort(loopback, strconv.Itoa(l.p.cfg.HTTP)) }

// Close stops the server; it is idempotent.
func (l *Lookupd) Close() { l.p.stop(true) }

// topicStats is a topic in nsqd's /stats.
type topicStats struct {
	Name     string `json:"topic_name"`
	Channels []struct {
		Name string `json:"channel_name"`
	} `json:"channels"`
}

// stats reads the topics, with their channels, from the /stats of the
// nsqd at httpAddr.
func stats(httpAddr string) ([]topicStats, error) {
	resp, err := http.Get("http://" + httpAddr + "/stats?format=json&include_clients=false")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st struct {
		Topics []topicStats `json:"topics"`
	}
	if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&st); err != nil {
		return nil, err
	}
	return st.Topics, nil
}

// Topics lists the topics the nsqd at httpAddr holds, from its /stats.
func Topics(httpAddr string) ([]string, error) {
	st, err := stats(httpAddr)
	var names []string
	for _, t := range st {
		names = append(names, t.Name)
	}
	return names, err
}

// Channels lists the channels of topic on the nsqd at httpAddr, from its
// /stats: none when it has no such topic.
func Channels(httpAddr, topic string) ([]string, error) {
	st, err := stats(httpAddr)
	var names []string
	for _, t := range st {
		if t.Name == topic {
			for _, c := range t.Channels {
				names = append(names, c.Name)
			}
		}
	}
	return names, err
}

// Post sends an HTTP POST of the nsqd API at httpAddr (path such as
// "/topic/delete") with the query parameters given, and fails unless the
// server answers 200.
func Post(httpAddr, path string, query url.Values) error {
	resp, err := http.Post("http://"+httpAddr+path+"?"+query.Encode(), "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var body [256]byte
		n, _ := resp.Body.Read(body[:])
		return fmt.Errorf("POST %s %v: %s: %s", path, query, resp.Status, body[:n])
	}
	return nil
}

// DeleteTopics deletes, from the nsqd at httpAddr, every topic whose name
// starts with prefix.
func DeleteTopics(httpAddr, prefix string) error {
	names, err := Topics(httpAddr)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			errs = append(errs, Post(httpAddr, "/topic/delete", url.Values{"topic": {n}}))
		}
	}
	return errors.Join(errs...)
}
