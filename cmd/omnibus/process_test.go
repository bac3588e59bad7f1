package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// A user of the tests' child processes: a fresh home directory, nothing
// of the machine's user but PATH.
func freshUser(t testing.TB) []string {
	t.Helper()
	return []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH"), asCLI + "=1"}
}

// proc is the omnibus command line running as a child process (the test
// binary, see TestMain).
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdout testenv.Buffer
	stderr testenv.Buffer
	done   chan struct{}
	err    error
}

// start runs omnibus args in env with stdin; the process is killed at
// cleanup if it is still running.
func start(t testing.TB, env []string, stdin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(os.Args[0], args...), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdin = strings.NewReader(stdin)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait returns the process's result once it ends, failing the test when
// that takes longer than timeout.
func (p *proc) wait(timeout time.Duration) result {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("omnibus %v did not end within %v\nstdout: %s\nstderr: %s", p.cmd.Args[1:], timeout, p.stdout.String(), p.stderr.String())
	}
	return result{stdout: p.stdout.String(), stderr: p.stderr.String(), code: p.cmd.ProcessState.ExitCode()}
}

// interrupt sends Ctrl-C.
func (p *proc) interrupt() {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
}

// waitOutput waits until the process's stdout contains want.
func (p *proc) waitOutput(want string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.stdout.String(), want) {
		select {
		case <-p.done:
			p.t.Fatalf("omnibus %v ended without printing %q\nstdout: %s\nstderr: %s", p.cmd.Args[1:], want, p.stdout.String(), p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("omnibus %v printed no %q in %v\nstdout: %s\nstderr: %s", p.cmd.Args[1:], want, timeout, p.stdout.String(), p.stderr.String())
		}
	}
}

// cli runs omnibus args to the end in a child process.
func cli(t testing.TB, env []string, stdin string, args ...string) result {
	t.Helper()
	return start(t, env, stdin, args...).wait(time.Minute)
}
