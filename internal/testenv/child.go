package testenv

import (
	"io"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Child runs the test binary again as a child process, with env added to
// its environment and args (such as "-test.run=^TestX$") on its command
// line: a test's way to run a server or a member in a process of its own,
// which the test can kill, or whose data races stay out of the test's
// process. The child reads its instructions from stdin, whose end tells it
// to exit, and writes its answers to stdout. At cleanup stdin is closed
// and the child gets grace to exit before it is killed; an exit other than
// clean is logged with what the child wrote to stderr.
func Child(t testing.TB, grace time.Duration, env []string, args ...string) (stdin io.WriteCloser, stdout io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env...)
	stderr := &Buffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err = cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("child process: %v\n%s", err, stderr.String())
			}
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("child process did not exit within %v of its input's end; killed\n%s", grace, stderr.String())
		}
	})
	return stdin, stdout
}
