package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
)

// asCLI, set in a child process's environment, makes the test binary
// run the omnibus command line (its arguments) instead of the tests.
const asCLI = "OMNIBUS_TEST_AS_CLI"

func TestMain(m *testing.M) {
	nsqtest.Main() // a child process running nsqd (see nsq_test.go)
	if os.Getenv(asCLI) != "" {
		os.Exit(runMain(os.Args[1:]))
	}
	// Commands run in-process on the default URL keep their data in a
	// directory of the tests', not in the user's.
	dir, err := os.MkdirTemp("", "omnibus-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	code := m.Run()
	stopNSQ()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one in-process run of the command produced.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// runCmd runs the command in-process with args and stdin, with no
// OMNIBUS_URL unless env sets it.
func runCmd(t testing.TB, ctx context.Context, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut,
		getenv: func(k string) string { return env[k] }}
	start := time.Now()
	code := a.run(ctx, args)
	return result{stdout: out.String(), stderr: errOut.String(), code: code, took: time.Since(start)}
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// memURL is a mem:// bus private to the test, kept alive for the test's
// duration by an open client, so commands run one after another share it.
func memURL(t testing.TB, params string) (string, *omnibus.Client) {
	t.Helper()
	name := strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name()))
	raw := "mem://" + name + params
	c, err := omnibus.Open(context.Background(), raw)
	if err != nil {
		t.Fatalf("open %s: %v", raw, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return raw, c
}

// wantCode fails the test when r did not exit with code.
func wantCode(t testing.TB, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// wantOneLineError checks the error contract: one line on stderr (after
// any notes), naming want, never showing secret.
func wantOneLineError(t testing.TB, r result, want, secret string) {
	t.Helper()
	stderr := r.stderr
	for strings.HasPrefix(stderr, "omnibus: note: ") {
		_, stderr, _ = strings.Cut(stderr, "\n")
	}
	if n := strings.Count(stderr, "\n"); n != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("stderr has %d lines, want 1:\n%s", n, r.stderr)
	}
	if strings.Count(stderr, "omnibus: ") != 1 || strings.Contains(stderr, "::") {
		t.Errorf("stderr = %q, want one \"omnibus: \" and no \"::\"", stderr)
	}
	if !strings.HasPrefix(stderr, "omnibus: ") {
		t.Errorf("stderr = %q, want it to start with \"omnibus: \"", r.stderr)
	}
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr = %q, want it to contain %q", r.stderr, want)
	}
	if secret != "" && (strings.Contains(r.stderr, secret) || strings.Contains(r.stdout, secret)) {
		t.Errorf("output shows the password %q:\nstdout: %s\nstderr: %s", secret, r.stdout, r.stderr)
	}
}

// leaky is a transport whose client library puts the whole URL, password
// included, in its errors; the command must still not show it.
type leaky struct{}

func (leaky) Open(_ context.Context, u *url.URL, _ driver.OpenOptions) (driver.Conn, error) {
	return nil, fmt.Errorf("dial %s: connection refused (password %s)", u.String(), func() string { p, _ := u.User.Password(); return p }())
}

// dropping is mem:// whose connection drops after its first two
// publishes: every later publish fails with an error that ends send.
type dropping struct{}

func (dropping) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	c, err := omnibus.Open(ctx, "mem://"+u.Host)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c.Driver()}, nil
}

type droppingConn struct {
	driver.Conn
	calls int
}

func (c *droppingConn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if c.calls++; c.calls > 2 {
		return errors.New("connection reset by peer")
	}
	return c.Conn.Publish(ctx, topic, msgs, opts)
}

func init() {
	omnibus.Register("leaky", leaky{})
	omnibus.Register("dropping", dropping{})
}
