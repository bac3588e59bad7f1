package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEmbeddedDefaultAcrossCommands: on the default URL, what one
// command sends, the next one reads (the help's own example, in separate
// processes, as a new user types it), because the embedded server keeps
// its data in the user's data directory; commands running at the same
// time share one server, which `omnibus server` runs in the foreground
// and names; a second server on the same data is refused, naming the
// process that holds it.
func TestEmbeddedDefaultAcrossCommands(t *testing.T) {
	help := runCmd(t, ctxT(t), nil, "", "--help")
	send := []string{"send", "--topic", "greetings"}
	tail := []string{"tail", "--topic", "greetings", "--from", "earliest", "--max", "1", "--json"}
	for _, line := range []string{"echo hello | omnibus " + strings.Join(send, " "), "omnibus " + strings.Join(tail, " ")} {
		if !strings.Contains(help.stdout, line) {
			t.Fatalf("the help's example lacks %q:\n%s", line, help.stdout)
		}
	}
	env := freshUser(t)
	r := cli(t, env, "hello\n", send...)
	wantCode(t, r, exitOK)
	r = cli(t, env, "", tail...)
	wantCode(t, r, exitOK)
	if ms := decodeLines(t, r.stdout); len(ms) != 1 || ms[0].Body != "hello" {
		t.Fatalf("tail printed %q, want the message hello sent by the command before", r.stdout)
	}
	home := strings.TrimPrefix(env[0], "HOME=")
	if _, err := os.Stat(filepath.Join(home, ".local", "share", "omnibus", "nats", "omnibus.lock")); err != nil {
		t.Errorf("the data is not in the user's data directory: %v", err)
	}

	// A server in the foreground: it says where it listens, and the
	// commands of the other processes use it.
	srv := start(t, env, "", "server")
	srv.waitOutput("listening on nats://127.0.0.1:", time.Minute)
	if !regexp.MustCompile(`listening on nats://127\.0\.0\.1:\d+, data in \S+omnibus/nats\n`).MatchString(srv.stdout.String()) {
		t.Errorf("server printed %q, want its address and data directory", srv.stdout.String())
	}
	live := start(t, env, "", "tail", "--topic", "live", "--group", "g", "--from", "earliest", "--max", "2", "--json")
	for _, body := range []string{"one", "two"} {
		wantCode(t, cli(t, env, body+"\n", "send", "--topic", "live"), exitOK)
	}
	r = live.wait(time.Minute)
	wantCode(t, r, exitOK)
	if ms := decodeLines(t, r.stdout); len(ms) != 2 {
		t.Errorf("tail printed %q, want the two messages sent meanwhile", r.stdout)
	}
	r = cli(t, env, "", "server")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "process "+strconv.Itoa(srv.cmd.Process.Pid)+" already runs one there", "")
	srv.interrupt()
	wantCode(t, srv.wait(30*time.Second), exitOK)

	// Without it, the data is still there.
	r = cli(t, env, "", "tail", "--topic", "live", "--from", "earliest", "--max", "2", "--json")
	wantCode(t, r, exitOK)
	if ms := decodeLines(t, r.stdout); len(ms) != 2 || ms[0].Body+ms[1].Body != "onetwo" && ms[0].Body+ms[1].Body != "twoone" {
		t.Errorf("tail printed %q after the server stopped, want one and two", r.stdout)
	}
}

// TestMemSaysItIsProcessLocal: a command that hands messages to others
// says that mem:// does not.
func TestMemSaysItIsProcessLocal(t *testing.T) {
	r := runCmd(t, ctxT(t), nil, "x\n", "send", "--url", "mem://", "--topic", "t")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stderr, "mem:// lives only in this process") {
		t.Errorf("stderr %q does not say mem:// lives only in this process", r.stderr)
	}
}
