package natsbus

// The embedded server: starting it in the process on a locked data
// directory, sharing it between the clients of the process (embeddedMu
// guards the table and the reference counts), and following another
// process's server through the dialer, which nats.go calls from its
// connecting goroutine. Server.mu guards a server's own state.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedHost is the host name of the embedded form of the URL:
// nats://embedded[?dir=DIR] runs a NATS server inside the process.
const EmbeddedHost = "embedded"

// DefaultURL is omnibus's zero-setup URL: a NATS server with JetStream
// running inside the process, storing in the per-user data directory
// ([DefaultDir]), so what one program publishes, the next one reads.
// While a process runs the server of a directory, another process that
// opens the same directory connects to that server instead of starting a
// second one on the same files.
const DefaultURL = "nats://" + EmbeddedHost

// DefaultMaxPayload is the largest message the embedded server accepts.
const DefaultMaxPayload = 8 << 20

// EmbeddedURL returns the URL of an embedded server storing its JetStream
// data in dir ("" for [DefaultDir]).
func EmbeddedURL(dir string) string {
	if dir == "" {
		return DefaultURL
	}
	return DefaultURL + "?dir=" + urlQueryEscape(dir)
}

// DefaultDir is where nats://embedded keeps its data when the URL names
// no dir: $XDG_DATA_HOME/omnibus/nats when XDG_DATA_HOME is set, else
// ~/.local/share/omnibus/nats (on macOS ~/Library/Application
// Support/omnibus/nats, on Windows %LocalAppData%\omnibus\nats).
func DefaultDir() (string, error) {
	base := os.Getenv("XDG_DATA_HOME")
	if base == "" || !filepath.IsAbs(base) {
		var err error
		switch runtime.GOOS {
		case "windows":
			base = os.Getenv("LocalAppData")
			if base == "" {
				err = errors.New("%LocalAppData% is not set")
			}
		case "darwin", "ios":
			var home string
			home, err = os.UserHomeDir()
			base = filepath.Join(home, "Library", "Application Support")
		default:
			var home string
			home, err = os.UserHomeDir()
			base = filepath.Join(home, ".local", "share")
		}
		if err != nil {
			return "", fmt.Errorf("natsbus: embedded server data directory: %w (set XDG_DATA_HOME, or the URL's dir)", err)
		}
	}
	return filepath.Join(base, "omnibus", "nats"), nil
}

// Server is a NATS server with JetStream running inside the process,
// listening on a random port of 127.0.0.1. Every client opened on the
// embedded URL with the same dir shares one Server; it stops when the
// last of them closes.
//
// A server holds a lock on its directory (the file omnibus.lock in it,
// which also says where the server listens), so no second server, in
// this process or another, ever runs on the same files. A client of the
// embedded URL that finds the directory locked by another process
// connects to that process's server; when that process ends, the client
// starts the directory's server itself (or connects to whichever process
// did first) and carries on with the same data.
type Server struct {
	dir        string
	tempDir    bool
	maxPayload int
	key        string // guarded by embeddedMu
	refs       int    // guarded by embeddedMu

	mu     sync.Mutex
	srv    *server.Server // nil while another process runs the server
	url    string
	pid    int      // the process that runs the server
	lock   *os.File // held while this process runs the server
	start  time.Duration
	closed bool
}

// ServerConfig configures an embedded server.
type ServerConfig struct {
	// Dir is where JetStream stores its files. Default: a new temporary
	// directory, removed by Close. NATS: store_dir.
	Dir string
	// MaxPayload is the largest message accepted. Default:
	// DefaultMaxPayload (8 MiB). NATS: max_payload.
	MaxPayload int
}

// StartServer starts an embedded NATS server with JetStream, on its own
// (not shared with the embedded URL's clients of this process; clients
// of other processes find it through the directory's lock file). It
// fails, naming the process, when a server already runs on cfg.Dir.
// Close stops it.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Dir != "" {
		abs, err := filepath.Abs(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("natsbus: embedded server data directory %q: %w", cfg.Dir, err)
		}
		cfg.Dir = abs
	}
	s, running, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if running != nil {
		return nil, fmt.Errorf("natsbus: start embedded server in %q: process %d already runs one there, at %s: %w",
			cfg.Dir, running.pid, running.url, ErrDirInUse)
	}
	return s, nil
}

// ErrDirInUse is StartServer's error when another server runs on the
// directory.
var ErrDirInUse = errors.New("data directory in use")

// lockFile is the file in an embedded server's directory that its
// process holds locked, and in which it says where the server listens.
const lockFile = "omnibus.lock"

// lockInfo is the content of the lock file.
type lockInfo struct {
	PID int    `json:"pid"`
	URL string `json:"url"`
}

// startServer starts a server on cfg.Dir (a temporary directory when
// empty). When another server runs there, it starts none and returns
// that server's address as running instead.
func startServer(ctx context.Context, cfg ServerConfig) (s, running *Server, err error) {
	begin := time.Now()
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	s = &Server{dir: cfg.Dir, maxPayload: cfg.MaxPayload, pid: os.Getpid()}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "omnibus-nats-")
		if err != nil {
			return nil, nil, fmt.Errorf("natsbus: start embedded server: temporary data directory: %w", err)
		}
		s.dir, s.tempDir = d, true
	} else if err := checkWritableDir(s.dir); err != nil {
		return nil, nil, err
	}
	s.lock, running, err = lockDir(ctx, s.dir)
	if err != nil || running != nil {
		_ = s.removeTemp()
		if running != nil {
			running.maxPayload = cfg.MaxPayload
		}
		return nil, running, err
	}
	fail := func(err error) (*Server, *Server, error) {
		s.unlock()
		_ = s.removeTemp()
		return nil, nil, err
	}
	opts := &server.Options{
		ServerName:            "omnibus-embedded",
		Host:                  "127.0.0.1",
		Port:                  server.RANDOM_PORT,
		JetStream:             true,
		StoreDir:              s.dir,
		MaxPayload:            int32(cfg.MaxPayload),
		NoLog:                 true,
		NoSigs:                true,
		DisableShortFirstPing: true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fail(fmt.Errorf("natsbus: start embedded server in %q: %w", s.dir, err))
	}
	go srv.Start()
	stop := func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
	wait := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if !srv.ReadyForConnections(wait) {
		stop()
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("natsbus: start embedded server in %q: %w", s.dir, err))
		}
		return fail(fmt.Errorf("natsbus: start embedded server in %q: not ready after %v (is the directory usable? JetStream may have failed to start)", s.dir, wait))
	}
	if !srv.JetStreamEnabled() {
		stop()
		return fail(fmt.Errorf("natsbus: start embedded server in %q: JetStream did not start", s.dir))
	}
	s.srv, s.url = srv, srv.ClientURL()
	if err := writeLock(s.lock, lockInfo{PID: s.pid, URL: s.url}); err != nil {
		stop()
		return fail(fmt.Errorf("natsbus: start embedded server in %q: write %s: %w", s.dir, lockFile, err))
	}
	s.start = time.Since(begin)
	return s, nil, nil
}

// lockDir takes the lock of dir. When another process (or another
// server of this one) holds it, it returns that server, as its lock file
// describes it, instead; while the holder is still starting, it waits
// for the description, within ctx.
func lockDir(ctx context.Context, dir string) (held *os.File, running *Server, err error) {
	name := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("natsbus: embedded server data directory %q: %w", dir, err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := tryLock(f)
		if err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("natsbus: embedded server data directory %q: lock %s: %w", dir, lockFile, err)
		}
		if ok {
			return f, nil, nil
		}
		// Held: read where its server listens. The holder writes that
		// once its server is ready; an empty or partial file means it is
		// still starting.
		b, err := os.ReadFile(name)
		var info lockInfo
		if err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			_ = f.Close()
			return nil, &Server{url: info.URL, pid: info.PID, dir: dir}, nil
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, nil, fmt.Errorf("natsbus: embedded server data directory %q: another process holds %s and has not said where its server listens: %w",
				dir, lockFile, ctx.Err())
		case <-tick.C:
		}
	}
}

// writeLock replaces the lock file's content with info.
func writeLock(f *os.File, info lockInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(b, '\n'), 0); err != nil {
		return err
	}
	return f.Sync()
}

// unlock releases the lock file, if this Server holds it, after
// emptying it: a reader that finds it empty waits for the lock.
func (s *Server) unlock() {
	if s.lock == nil {
		return
	}
	_ = s.lock.Truncate(0)
	_ = s.lock.Close() // releases the lock
	s.lock = nil
}

// checkWritableDir creates dir when missing and checks that files can be
// created in it, so a bad directory is a clear error at Open rather than
// a JetStream failure later.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("natsbus: embedded server data directory %q: cannot create it: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".omnibus-write-check-")
	if err != nil {
		return fmt.Errorf("natsbus: embedded server data directory %q: not writable: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return nil
}

// URL is the server's client URL, nats://127.0.0.1:PORT.
func (s *Server) URL() string {
	_, url := s.owner()
	return url
}

// Dir is the JetStream data directory.
func (s *Server) Dir() string { return s.dir }

// StartupTime is how long the server took to start and become ready.
func (s *Server) StartupTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.start
}

// NATSServer returns the nats-server instance, for in-process
// connections (nats.InProcessServer) and the server's own extras; nil
// while the server runs in another process.
func (s *Server) NATSServer() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// owner returns the process that runs the server and its address.
func (s *Server) owner() (pid int, url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid, s.url
}

// dial connects a NATS client (nats.SetCustomDialer) to the directory's
// server while another process runs it: to the address in the lock
// file, or, once that process is gone, to a server this process starts
// on the directory (or that another process started first).
func (s *Server) dial(network, _ string) (net.Conn, error) {
	_, url := s.owner()
	conn, err := dialURL(network, url)
	if err == nil {
		return conn, nil
	}
	if terr := s.takeover(); terr != nil {
		return nil, errors.Join(err, terr)
	}
	_, url = s.owner()
	return dialURL(network, url)
}

func dialURL(network, url string) (net.Conn, error) {
	return net.DialTimeout(network, strings.TrimPrefix(url, "nats://"), 2*time.Second)
}

// dialer adapts dial to nats.CustomDialer.
type dialer struct{ s *Server }

func (d dialer) Dial(network, address string) (net.Conn, error) { return d.s.dial(network, address) }

// takeover starts the directory's server in this process after the
// process that ran it ended, or learns where the process that did so
// first listens.
func (s *Server) takeover() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil || s.closed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, running, err := startServer(ctx, ServerConfig{Dir: s.dir, MaxPayload: s.maxPayload})
	switch {
	case err != nil:
		return err
	case running != nil:
		s.pid, s.url = running.pid, running.url
	default:
		s.srv, s.url, s.pid, s.lock, s.start = n.srv, n.url, n.pid, n.lock, n.start
	}
	return nil
}

// Close stops the server, if this process runs it, releases its
// directory and removes it when it was a temporary one. Close is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.srv == nil {
		return nil // another process's server
	}
	if s.lock != nil {
		_ = s.lock.Truncate(0) // clients that lose the server wait for the lock
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.unlock()
	return s.removeTemp()
}

func (s *Server) removeTemp() error {
	if !s.tempDir {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("natsbus: remove embedded server data directory %q: %w", s.dir, err)
	}
	return nil
}

// Servers behind the embedded URL, shared by data directory: those this
// process runs, and those of other processes it connects to.
var (
	embeddedMu sync.Mutex
	embedded   = map[string]*Server{}
)

// acquireEmbedded returns the shared server for cfg.Dir ([DefaultDir]
// when empty): the one this process already runs or connects to, else a
// new one, else, when another process runs one there, that one.
func acquireEmbedded(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Dir == "" {
		d, err := DefaultDir()
		if err != nil {
			return nil, err
		}
		cfg.Dir = d
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("natsbus: embedded server data directory %q: %w", cfg.Dir, err)
	}
	cfg.Dir = abs
	embeddedMu.Lock()
	defer embeddedMu.Unlock()
	if s := embedded[abs]; s != nil {
		s.refs++
		return s, nil
	}
	s, running, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if running != nil {
		s = running
	}
	s.key, s.refs = abs, 1
	embedded[abs] = s
	return s, nil
}

// releaseEmbedded drops a client's hold on s and stops it after the last.
func releaseEmbedded(s *Server) error {
	embeddedMu.Lock()
	s.refs--
	last := s.refs == 0
	if last && embedded[s.key] == s {
		delete(embedded, s.key)
	}
	embeddedMu.Unlock()
	if !last {
		return nil
	}
	return s.Close()
}

var errNotEmbedded = errors.New("parameter only valid for the embedded server (nats://embedded)")
