package console

// HTTP: the page (files embedded from web/), the state as JSON and as
// server-sent events, one dead letter's view, and the calls that change
// state (replay, delete, stop), which need AllowReplay and, when set, the
// token. Every request runs on net/http's goroutines; an event stream
// ends with its request or with Close of the server's listener.

import (
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus/dlq"
)

//go:embed web
var web embed.FS

// Handler serves the page at / and its API under /api/:
//
//	GET  /api/state                  the state (JSON)
//	GET  /api/events                 the state at each change (server-sent events, "state")
//	GET  /api/deadletter?source=0&topic=T&id=ID&format=auto|text|json|hex
//	                                 one dead letter, its body formatted, cut at 256 KiB
//	POST /api/replay, /api/delete    {"source":0,"topic":"T","ids":["..."]} or "all":true, "to" (replay)
//	POST /api/stop                   {"source":0,"job":1}
//
// Requests whose Host is not a loopback name are refused when the
// console listens on loopback (a page of another site cannot reach it
// through a name of its own), and a POST must carry JSON from the same
// origin.
func (srv *Server) Handler() http.Handler {
	files, _ := fs.Sub(web, "web")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(files))
	mux.HandleFunc("GET /api/state", srv.serveState)
	mux.HandleFunc("GET /api/events", srv.serveEvents)
	mux.HandleFunc("GET /api/deadletter", srv.serveDeadLetter)
	mux.HandleFunc("POST /api/replay", srv.changing(srv.serveJob("replay")))
	mux.HandleFunc("POST /api/delete", srv.changing(srv.serveJob("delete")))
	mux.HandleFunc("POST /api/stop", srv.changing(srv.serveStop))
	return guardHost(mux)
}

// guardHost refuses a request to a loopback listener that names a host
// other than a loopback one (DNS rebinding).
func guardHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && isLoopback(local.String()) && !isLoopback(r.Host) {
			http.Error(w, "the console answers to loopback names only", http.StatusForbidden)
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'")
		next.ServeHTTP(w, r)
	})
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// changing guards a call that changes state: replay must be allowed, the
// token given when set, the body JSON from the page's own origin.
func (srv *Server) changing(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !srv.o.AllowReplay {
			httpError(w, http.StatusForbidden, "the console is read-only: start it with --allow-replay to replay or delete")
			return
		}
		if srv.o.Token != "" {
			got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			if subtle.ConstantTimeCompare([]byte(got), []byte(srv.o.Token)) != 1 {
				httpError(w, http.StatusUnauthorized, "a token is needed: the console was started with --token")
				return
			}
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			httpError(w, http.StatusUnsupportedMediaType, "send JSON")
			return
		}
		if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host && o != "https://"+r.Host {
			httpError(w, http.StatusForbidden, "cross-origin request refused")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		h(w, r)
	}
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

func (srv *Server) serveState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, srv.snapshot())
}

// serveEvents sends the state at once and after each change, at most
// every 250 ms, as server-sent events; the browser's EventSource
// reconnects by itself when the stream breaks.
func (srv *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		httpError(w, http.StatusInternalServerError, "streaming unsupported")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprint(w, "retry: 2000\n\n")
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		_, next := srv.watch()
		b, err := json.Marshal(srv.snapshot())
		if err != nil {
			return
		}
		if _, err := fmt.Fprintf(w, "event: state\ndata: %s\n\n", b); err != nil {
			return
		}
		fl.Flush()
	wait:
		select {
		case <-r.Context().Done():
			return
		case <-srv.closed:
			return
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
			goto wait
		case <-next:
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// viewBytes is the most of a body one dead letter's view shows.
const viewBytes = 256 << 10

type deadLetterView struct {
	dlq.View
	Format    string `json:"format"`
	Formatted string `json:"formatted"`
	Cut       bool   `json:"cut"`
	FormatErr string `json:"format_error,omitempty"`
}

func (srv *Server) serveDeadLetter(w http.ResponseWriter, r *http.Request) {
	s, ok := srv.source(w, r.URL.Query().Get("source"))
	if !ok {
		return
	}
	topic, id, format := r.URL.Query().Get("topic"), r.URL.Query().Get("id"), r.URL.Query().Get("format")
	if format == "" {
		format = dlq.FormatAuto
	}
	l, ok := s.find(topic, id)
	if !ok {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no dead letter %q listed in %q", id, topic))
		return
	}
	v := deadLetterView{View: l.dl.View(previewBytes), Format: format}
	v.BodyBytes = l.size
	body, cut, err := dlq.FormatBody(l.dl.Body, format, viewBytes)
	if err != nil {
		v.FormatErr = err.Error()
		body, cut, _ = dlq.FormatBody(l.dl.Body, dlq.FormatText, viewBytes)
	}
	v.Formatted, v.Cut = body, cut || l.size > len(l.dl.Body)
	writeJSON(w, v)
}

func (s *source) find(topic, id string) (listed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.dead {
		if d.topic != topic {
			continue
		}
		for _, l := range d.listed {
			if l.dl.ID == id {
				return l, true
			}
		}
	}
	return listed{}, false
}

// source returns the source with index id, or writes an error.
func (srv *Server) source(w http.ResponseWriter, id string) (*source, bool) {
	i, err := strconv.Atoi(id)
	if err != nil || i < 0 || i >= len(srv.sources) {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no source %q", id))
		return nil, false
	}
	return srv.sources[i], true
}

func (srv *Server) serveJob(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req jobRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			httpError(w, http.StatusBadRequest, "bad request: "+err.Error())
			return
		}
		s, ok := srv.source(w, strconv.Itoa(req.Source))
		if !ok {
			return
		}
		srv.mu.Lock()
		ctx := srv.ctx
		srv.mu.Unlock()
		if ctx == nil || ctx.Err() != nil {
			httpError(w, http.StatusServiceUnavailable, "the console is not running")
			return
		}
		id, err := s.start(ctx, action, req)
		switch {
		case errors.Is(err, errConflict):
			httpError(w, http.StatusConflict, err.Error())
			return
		case err != nil:
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		srv.changed()
		writeJSON(w, map[string]int{"job": id})
	}
}

func (srv *Server) serveStop(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Source int `json:"source"`
		Job    int `json:"job"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "bad request: "+err.Error())
		return
	}
	s, ok := srv.source(w, strconv.Itoa(req.Source))
	if !ok {
		return
	}
	if !s.stop(req.Job) {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no running job %d", req.Job))
		return
	}
	writeJSON(w, map[string]bool{"stopping": true})
}
