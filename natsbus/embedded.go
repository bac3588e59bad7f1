package natsbus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedHost is the host name of the embedded form of the URL:
// nats://embedded[?dir=DIR] starts a NATS server inside the process.
const EmbeddedHost = "embedded"

// DefaultURL is omnibus's zero-setup URL: a NATS server with JetStream
// running inside the process, storing in a temporary directory that is
// removed when the last client closes. Use [EmbeddedURL] to keep the data.
const DefaultURL = "nats://" + EmbeddedHost

// DefaultMaxPayload is the largest message the embedded server accepts.
const DefaultMaxPayload = 8 << 20

// EmbeddedURL returns the URL of an embedded server storing its JetStream
// data in dir ("" for a temporary directory).
func EmbeddedURL(dir string) string {
	if dir == "" {
		return DefaultURL
	}
	return DefaultURL + "?dir=" + urlQueryEscape(dir)
}

// Server is a NATS server with JetStream running inside the process,
// listening on a random port of 127.0.0.1. Every client opened on the
// embedded URL with the same dir shares one Server; it stops when the
// last of them closes.
type Server struct {
	srv     *server.Server
	dir     string
	tempDir bool
	key     string
	refs    int // guarded by embeddedMu
	start   time.Duration

	closeOnce sync.Once
	closeErr  error
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
// (not shared with the embedded URL's servers). Close stops it.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	return startServer(ctx, cfg)
}

func startServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	begin := time.Now()
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	s := &Server{dir: cfg.Dir}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "omnibus-nats-")
		if err != nil {
			return nil, fmt.Errorf("natsbus: start embedded server: temporary data directory: %w", err)
		}
		s.dir, s.tempDir = d, true
	} else if err := checkWritableDir(s.dir); err != nil {
		return nil, err
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
		s.removeTemp()
		return nil, fmt.Errorf("natsbus: start embedded server in %q: %w", s.dir, err)
	}
	s.srv = srv
	go srv.Start()
	wait := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if !srv.ReadyForConnections(wait) {
		srv.Shutdown()
		srv.WaitForShutdown()
		s.removeTemp()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("natsbus: start embedded server in %q: %w", s.dir, err)
		}
		return nil, fmt.Errorf("natsbus: start embedded server in %q: not ready after %v (is the directory usable? JetStream may have failed to start)", s.dir, wait)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		s.removeTemp()
		return nil, fmt.Errorf("natsbus: start embedded server in %q: JetStream did not start", s.dir)
	}
	s.start = time.Since(begin)
	return s, nil
}

// checkWritableDir creates dir when missing and checks that files can be
// created in it, so a bad directory is a clear error at Open rather than
// a JetStream failure later.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
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
func (s *Server) URL() string { return s.srv.ClientURL() }

// Dir is the JetStream data directory.
func (s *Server) Dir() string { return s.dir }

// StartupTime is how long the server took to start and become ready.
func (s *Server) StartupTime() time.Duration { return s.start }

// NATSServer returns the nats-server instance, for in-process
// connections (nats.InProcessServer) and the server's own extras.
func (s *Server) NATSServer() *server.Server { return s.srv }

// Close stops the server and removes its data directory when it was a
// temporary one. Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.closeErr = s.removeTemp()
	})
	return s.closeErr
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

// Servers behind the embedded URL, shared by data directory.
var (
	embeddedMu sync.Mutex
	embedded   = map[string]*Server{}
)

// acquireEmbedded returns the shared server for dir, starting it when no
// client holds it.
func acquireEmbedded(ctx context.Context, cfg ServerConfig) (*Server, error) {
	key := ""
	if cfg.Dir != "" {
		abs, err := filepath.Abs(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("natsbus: embedded server data directory %q: %w", cfg.Dir, err)
		}
		cfg.Dir, key = abs, abs
	}
	embeddedMu.Lock()
	defer embeddedMu.Unlock()
	if s := embedded[key]; s != nil {
		s.refs++
		return s, nil
	}
	s, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s.key, s.refs = key, 1
	embedded[key] = s
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
