package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/console"
	_ "github.com/omnibus-go/omnibus/membus"
)

// serve runs a console with o on mem:// and serves it until the test ends.
func serve(t *testing.T, o console.Options) string {
	t.Helper()
	if o.Sources == nil {
		o.Sources = []console.Source{{URL: "mem://" + strings.ToLower(t.Name()), Topics: []string{"orders"}, Groups: []string{"billing"}}}
	}
	srv, err := console.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { stop(); <-ran; hs.Close() })
	return hs.URL
}

func do(t *testing.T, method, url, body string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSafety: read-only unless replay is allowed; the token; JSON from
// the page's origin only; loopback host names only; no password shown.
func TestSafety(t *testing.T) {
	replay := `{"source":0,"topic":"orders.dlq","all":true}`
	js := map[string]string{"Content-Type": "application/json"}

	ro := serve(t, console.Options{})
	if code, body := do(t, "POST", ro+"/api/replay", replay, js); code != http.StatusForbidden || !strings.Contains(body, "--allow-replay") {
		t.Errorf("replay on a read-only console: %d %s", code, body)
	}
	if code, _ := do(t, "GET", ro+"/api/state", "", map[string]string{"Host": "evil.example:80"}); code != http.StatusForbidden {
		t.Errorf("a request naming another host: %d, want 403", code)
	}
	if code, body := do(t, "GET", ro+"/", "", map[string]string{"Host": "localhost"}); code != http.StatusOK || !strings.Contains(body, "omnibus console") {
		t.Errorf("the page: %d", code)
	}

	rw := serve(t, console.Options{AllowReplay: true, Token: "t0ken", Sources: []console.Source{{
		URL: "mem://safety-rw?partitions=2", Topics: []string{"orders"}, Groups: []string{"billing"}}}})
	for _, c := range []struct {
		name   string
		header map[string]string
		code   int
	}{
		{"no token", js, http.StatusUnauthorized},
		{"wrong token", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"a form", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer t0ken"}, http.StatusUnsupportedMediaType},
		{"another origin", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer t0ken", "Origin": "http://evil.example"}, http.StatusForbidden},
	} {
		if code, body := do(t, "POST", rw+"/api/replay", replay, c.header); code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.code)
		}
	}
	ok := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer t0ken"}
	if code, body := do(t, "POST", rw+"/api/replay", `{"source":0,"topic":"nope.dlq","all":true}`, ok); code != http.StatusBadRequest || !strings.Contains(body, "not a dead-letter topic") {
		t.Errorf("replay of a topic the console does not show: %d %s", code, body)
	}
	if code, body := do(t, "POST", rw+"/api/replay", `{"source":0,"topic":"orders.dlq"}`, ok); code != http.StatusBadRequest || !strings.Contains(body, "say which") {
		t.Errorf("replay without a selection: %d %s", code, body)
	}
}

// TestPasswordHidden: the state names a source without its password,
// and its errors too.
func TestPasswordHidden(t *testing.T) {
	url := serve(t, console.Options{Interval: 100 * time.Millisecond, Sources: []console.Source{{
		URL: "amqp://guest:s3cret@127.0.0.1:1/", Topics: []string{"orders"}, Groups: []string{"billing"}}}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, body := do(t, "GET", url+"/api/state", "", nil)
		var st struct {
			Sources []struct{ Name, Status, Error string }
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(body, "s3cret") {
			t.Fatalf("the state shows the password: %s", body)
		}
		if s := st.Sources[0]; s.Status == "unreachable" && s.Error != "" && strings.Contains(s.Name, "guest:xxxxx@") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %s: want the source unreachable, with its error", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
