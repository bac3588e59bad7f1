package omnibus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// readmeBlock returns the body of the first code block of README.md
// fenced as lang that contains substr.
func readmeBlock(t *testing.T, lang, substr string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range strings.Split(string(b), "```"+lang+"\n")[1:] {
		block, _, ok := strings.Cut(part, "```")
		if ok && strings.Contains(block, substr) {
			return block
		}
	}
	t.Fatalf("README.md has no ```%s block containing %q", lang, substr)
	return ""
}

// helloCommand is the README's command line that runs the first example,
// as a user types it (without its comment).
func helloCommand(t *testing.T) []string {
	t.Helper()
	for line := range strings.SplitSeq(readmeBlock(t, "sh", "./examples/hello"), "\n") {
		if strings.Contains(line, "./examples/hello") {
			cmd, _, _ := strings.Cut(line, "#")
			return strings.Fields(cmd)
		}
	}
	panic("unreachable")
}

// orderLine is what the first example logs for its order.
var orderLine = regexp.MustCompile(`^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d order (\S+) for customer-7: \{"total":42\}$`)

// goEnv is the environment of a user whose home is home: the build
// caches stay where they are (they hold no user data), everything else
// of the user's is fresh.
func goEnv(t *testing.T, home string) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "-json", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var dirs map[string]string
	if err := json.Unmarshal(out, &dirs); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home, "GOTOOLCHAIN=local", "PATH=" + os.Getenv("PATH")}
	for k, v := range dirs {
		env = append(env, k+"="+v)
	}
	return env
}

// runHello runs args like a user in a terminal: it waits for the order
// line, presses Ctrl-C (SIGINT to the process group, as a terminal
// does), and returns the order's ID after checking that the program
// printed that one order and ended cleanly. When only is set, the order
// line must be all it printed; otherwise other log lines (a transport's
// warnings) are allowed, and shown.
func runHello(t *testing.T, env []string, only bool, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr testenv.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}()
	// The first run compiles the program: allow for a cold build cache.
	deadline := time.After(5 * time.Minute)
	for !strings.Contains(stderr.String(), "\n") {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%v ended before printing (%v):\nstdout: %s\nstderr: %s", args, err, stdout.String(), stderr.String())
		case <-deadline:
			t.Fatalf("%v printed nothing in 5 minutes:\nstdout: %s\nstderr: %s", args, stdout.String(), stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	time.Sleep(200 * time.Millisecond) // a second order line, if any, has time to show
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		// go run itself exits 1 after an interrupt, whatever the program
		// did (its builder records the signal): the program's own output,
		// checked below, says whether it ended cleanly.
		goRun := len(args) > 1 && args[0] == "go" && args[1] == "run"
		if err != nil && (!goRun || cmd.ProcessState.ExitCode() != 1) {
			t.Errorf("%v after Ctrl-C: %v, want a clean exit\nstderr: %s", args, err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%v did not end within 30s of Ctrl-C:\nstderr: %s", args, stderr.String())
	}
	var orders [][]string
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	for _, line := range lines {
		if m := orderLine.FindStringSubmatch(line); m != nil {
			orders = append(orders, m)
		} else if !only {
			t.Logf("%v also printed: %s", args, line)
		}
	}
	if len(orders) != 1 || only && len(lines) != 1 || stdout.String() != "" {
		t.Fatalf("%v printed\nstdout: %q\nstderr: %q\nwant one line on stderr like %q", args, stdout.String(), stderr.String(), orderLine)
	}
	return orders[0][1]
}

// TestReadmeFirstExample runs the README's first example as a new user
// does, on a fresh home directory: the program in the README is
// examples/hello/main.go, and the set-up's command for it prints its
// order on the first run, on the embedded default, and ends on Ctrl-C.
func TestReadmeFirstExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	code := readmeBlock(t, "go", "func main()")
	file, err := os.ReadFile("examples/hello/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if code != string(file) {
		t.Fatalf("README.md's first example and examples/hello/main.go differ; the README shows the file as it is")
	}
	env := goEnv(t, t.TempDir())
	args := helloCommand(t)
	first := runHello(t, env, true, args...)
	second := runHello(t, env, true, args...)
	if first == second {
		t.Errorf("both runs printed order %s, want each its own", first)
	}
}

// TestReadmeFirstExampleOtherTransports: changing the URL and nothing
// else runs the example on Kafka; on the machine's shared RabbitMQ and
// NATS the test also renames the topic and group, so as to take nothing
// of anyone else's, and removes them afterwards.
func TestReadmeFirstExampleOtherTransports(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	abs, err := filepath.Abs("examples/hello/main.go")
	if err != nil {
		t.Fatal(err)
	}
	code, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	env := goEnv(t, t.TempDir())
	// run builds the example with the URL (and names) replaced, through an
	// overlay, so that the file on disk is the one the README shows.
	run := func(t *testing.T, replace ...string) {
		dir := t.TempDir()
		src := strings.NewReplacer(replace...).Replace(string(code))
		if src == string(code) {
			t.Fatalf("replacing %q changed nothing", replace)
		}
		srcFile := filepath.Join(dir, "main.go")
		overlay := filepath.Join(dir, "overlay.json")
		ov, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: srcFile}})
		for name, b := range map[string][]byte{srcFile: []byte(src), overlay: ov} {
			if err := os.WriteFile(name, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		bin := filepath.Join(dir, "hello")
		build := exec.Command("go", "build", "-overlay", overlay, "-o", bin, "./examples/hello")
		build.Env = env
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		runHello(t, env, false, bin)
	}
	const natsImport = `_ "github.com/omnibus-go/omnibus/natsbus" // registers nats://, with an embedded server`
	t.Run("kafka", func(t *testing.T) {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		run(t, `"nats://embedded"`, fmt.Sprintf("%q", "kafka://"+c.ListenAddrs()[0]),
			natsImport, `_ "github.com/omnibus-go/omnibus/kafkabus"`)
	})
	name := fmt.Sprintf("readme-%d", time.Now().UnixNano())
	t.Run("rabbitmq", func(t *testing.T) {
		testenv.Require(t, "RabbitMQ", "127.0.0.1:5672", "rabbitmq-server -detached")
		const raw = "amqp://guest:guest@127.0.0.1:5672/"
		t.Cleanup(func() {
			ac, err := amqp.Dial(raw)
			if err != nil {
				t.Logf("cleanup: %v", err)
				return
			}
			defer ac.Close()
			ch, err := ac.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(name+":"+name, false, false, false)
			_ = ch.ExchangeDelete(name, false, false)
		})
		run(t, `"nats://embedded"`, fmt.Sprintf("%q", raw), `"orders"`, fmt.Sprintf("%q", name), `"billing"`, fmt.Sprintf("%q", name),
			natsImport, `_ "github.com/omnibus-go/omnibus/rabbitbus"`)
	})
	t.Run("nats", func(t *testing.T) {
		testenv.Require(t, "NATS", "127.0.0.1:4222", "nats-server -js")
		const raw = "nats://127.0.0.1:4222"
		t.Cleanup(func() {
			nc, err := nats.Connect(raw)
			if err != nil {
				return
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if s, err := js.StreamNameBySubject(ctx, name); err == nil {
				_ = js.DeleteStream(ctx, s)
			}
		})
		run(t, `"nats://embedded"`, fmt.Sprintf("%q", raw), `"orders"`, fmt.Sprintf("%q", name), `"billing"`, fmt.Sprintf("%q", name))
	})
}
