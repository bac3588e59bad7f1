package natsbus_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// permServerDir, in the environment, makes the test binary the process
// of a permServer (see TestMain), its store in that directory.
const permServerDir = "NATSBUS_PERMSERVER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(permServerDir); dir != "" {
		os.Exit(servePerm(dir))
	}
	os.Exit(m.Run())
}

// permServer starts a nats-server with JetStream on a free loopback port,
// stopped at cleanup, with two users (password "pw"): "admin", who may
// publish anywhere, and "member", who may too until deny reloads the
// server to deny it the subjects given (none: allowed again). A denied
// publish gets no answer: a request on it waits out its timeout. It
// returns the server's address.
//
// The server runs in a process of its own (this test binary, run again):
// nats-server's option reload writes the server's options while its
// direct gets read them without its lock (server.go setOpts against
// stream.go getDirectRequest, v2.15.3), a data race of the server's that
// the race detector would pin on the test that reloads.
func permServer(t *testing.T) (addr string, deny func(subjects ...string)) {
	t.Helper()
	stdin, stdout := testenv.Child(t, 10*time.Second, []string{permServerDir + "=" + t.TempDir()})
	out := bufio.NewReader(stdout)
	reply := func() string {
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("the server's process: %v", err)
		}
		return strings.TrimSpace(line)
	}
	addr = reply()
	return addr, func(subjects ...string) {
		t.Helper()
		if _, err := fmt.Fprintln(stdin, strings.Join(subjects, " ")); err != nil {
			t.Fatal(err)
		}
		if r := reply(); r != "ok" {
			t.Fatalf("reload: %s", r)
		}
	}
}

// servePerm is a permServer's process: it prints the server's address,
// then reloads the server for each line it reads (the subjects denied to
// "member", separated by spaces; none: allowed again) and prints "ok" or
// the error, until its input ends. It returns the exit status.
func servePerm(dir string) int {
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "member", Password: "pw"}, {Username: "admin", Password: "pw"}},
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "the NATS server did not start")
		return 1
	}
	running := opts.Clone()
	running.Port = s.Addr().(*net.TCPAddr).Port
	fmt.Println(s.Addr().String())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		o := running.Clone()
		if subjects := strings.Fields(in.Text()); len(subjects) > 0 {
			o.Users[0].Permissions = &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: subjects}}
		}
		if err := s.ReloadOptions(o); err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println("ok")
	}
	return 0
}
