package rabbitbus

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/internal/authtest"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// rabbitmqServer is the RabbitMQ start script run for the test's own
// node. The Debian wrapper in /usr/sbin would run it as the rabbitmq
// user with that user's home and cookie; the script itself runs as
// whoever calls it.
var rabbitmqServer = testenv.Getenv("RABBITBUS_SERVER_BIN", "/usr/lib/rabbitmq/bin/rabbitmq-server")

// tlsNode is a RabbitMQ node of the test's own: a second node beside the
// shared broker, with its own name, ports, data, logs, cookie and
// configuration in a temporary directory, so nothing the test does
// touches the shared one. It speaks AMQP over TLS only.
type tlsNode struct {
	name string
	port int // AMQPS
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// nodeUser is a user of a test node: name, password (empty: no
// password, for logins by certificate), full permissions on "/".
type nodeUser struct{ name, password string }

// startTLSNode starts a node whose TLS listener presents the server
// certificate of certs and verifies client certificates against its CA
// when a client offers one, with the users given, and the plugins
// named. It stops the node at cleanup. Outside CI a machine without
// RabbitMQ skips the test.
func startTLSNode(t *testing.T, certs *authtest.Set, users []nodeUser, plugins ...string) *tlsNode {
	t.Helper()
	if _, err := os.Stat(rabbitmqServer); err != nil {
		testenv.SkipOrFail(t, "missing server", fmt.Sprintf("%s not found (%v): install rabbitmq-server", rabbitmqServer, err))
	}
	dir := t.TempDir()
	ports := freePorts(t, 3)
	n := &tlsNode{
		name: fmt.Sprintf("omnibus-tls-%d-%d@localhost", os.Getpid(), ports[0]),
		port: ports[0],
		dir:  dir,
		done: make(chan struct{}),
	}
	home := filepath.Join(dir, "home")
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	writeFile(t, filepath.Join(home, ".erlang.cookie"), strings.ToUpper(hex.EncodeToString(cookie)), 0o400) // erl refuses a cookie others can read
	writeFile(t, filepath.Join(dir, "enabled_plugins"), "["+strings.Join(plugins, ",")+"].\n", 0o600)
	writeFile(t, filepath.Join(dir, "rabbitmq-env.conf"), "", 0o600) // instead of /etc/rabbitmq's, which names the shared node
	writeFile(t, filepath.Join(dir, "definitions.json"), definitions(t, users), 0o600)
	writeFile(t, filepath.Join(dir, "rabbitmq.conf"), strings.Join([]string{
		"listeners.tcp = none",
		"listeners.ssl.default = 127.0.0.1:" + strconv.Itoa(n.port),
		"ssl_options.cacertfile = " + certs.CA,
		"ssl_options.certfile = " + certs.ServerCert,
		"ssl_options.keyfile = " + certs.ServerKey,
		"ssl_options.verify = verify_peer",
		"ssl_options.fail_if_no_peer_cert = false",
		"auth_mechanisms.1 = PLAIN",
		"auth_mechanisms.2 = AMQPLAIN",
		"auth_mechanisms.3 = EXTERNAL",
		"ssl_cert_login_from = common_name",
		"loopback_users = none",
		"load_definitions = " + filepath.Join(dir, "definitions.json"),
		"",
	}, "\n"), 0o600)

	n.cmd = exec.Command(rabbitmqServer)
	n.cmd.Dir = dir
	n.cmd.Env = append(os.Environ(),
		"HOME="+home,
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(ports[1]),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[2]),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_CRASH_DUMP="+filepath.Join(dir, "erl_crash.dump"),
	)
	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	// Its own process group: the start script execs erl, which starts
	// helpers (epmd is shared and outlives the node), and stopping the
	// group reaches them all.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", rabbitmqServer, err)
	}
	go func() {
		_ = n.cmd.Wait()
		_ = out.Close()
		close(n.done)
	}()
	t.Cleanup(n.stop)

	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", n.addr(), time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-n.done:
			t.Fatalf("RabbitMQ node %s ended before it listened on %s:\n%s", n.name, n.addr(), n.output())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("RabbitMQ node %s did not listen on %s within 90s:\n%s", n.name, n.addr(), n.output())
		}
	}
	return n
}

func (n *tlsNode) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// stop ends the node: SIGTERM, which it takes as a clean shutdown, then
// SIGKILL to its process group if it is still there after 30 seconds.
func (n *tlsNode) stop() {
	pgid := n.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-n.done
	}
}

// output is the end of the node's console output and log, for failures.
func (n *tlsNode) output() string {
	var b bytes.Buffer
	for _, f := range []string{filepath.Join(n.dir, "server.out"), filepath.Join(n.dir, "log", n.name+".log")} {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", f, data)
	}
	return b.String()
}

// definitions is the definitions file the node imports at boot: the
// users with their password hashes, as rabbit_password_hashing_sha256
// stores them (a 4-byte salt, then SHA-256 of salt and password), and
// their permissions on the virtual host "/".
func definitions(t *testing.T, users []nodeUser) string {
	t.Helper()
	type user struct {
		Name      string `json:"name"`
		Hash      string `json:"password_hash"`
		Algorithm string `json:"hashing_algorithm"`
		Tags      string `json:"tags"`
	}
	type permission struct {
		User      string `json:"user"`
		Vhost     string `json:"vhost"`
		Configure string `json:"configure"`
		Write     string `json:"write"`
		Read      string `json:"read"`
	}
	var defs struct {
		Users       []user              `json:"users"`
		Vhosts      []map[string]string `json:"vhosts"`
		Permissions []permission        `json:"permissions"`
	}
	defs.Vhosts = []map[string]string{{"name": "/"}}
	for _, u := range users {
		hash := ""
		if u.password != "" {
			salt := make([]byte, 4)
			_, _ = rand.Read(salt)
			sum := sha256.Sum256(append(salt, u.password...))
			hash = base64.StdEncoding.EncodeToString(append(salt, sum[:]...))
		}
		defs.Users = append(defs.Users, user{u.name, hash, "rabbit_password_hashing_sha256", ""})
		defs.Permissions = append(defs.Permissions, permission{u.name, "/", ".*", ".*", ".*"})
	}
	data, err := json.Marshal(defs)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func writeFile(t *testing.T, path, data string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
}
