package nsqtest

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

// TestStopStart: a message nsqd holds survives a graceful stop and start
// on the same ports and data directory, and Close ends the process.
func TestStopStart(t *testing.T) {
	n := StartNSQD(t, Config{})
	q := url.Values{"topic": {"t"}, "channel": {"c"}}
	for _, path := range []string{"/topic/create", "/channel/create"} {
		if err := Post(n.HTTPAddr(), path, q); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post("http://"+n.HTTPAddr()+"/pub?topic=t", "application/octet-stream", strings.NewReader("kept"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if topics, err := Topics(n.HTTPAddr()); err != nil || len(topics) != 1 || topics[0] != "t" {
		t.Fatalf("after a restart nsqd holds topics %v (%v), want [t]", topics, err)
	}
	if n.CPU() <= 0 {
		t.Logf("no processor time read (no /proc?)")
	}
	resp, err = http.Get("http://" + n.HTTPAddr() + "/stats?format=json&topic=t&channel=c")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	if !strings.Contains(b.String(), `"depth":1`) {
		t.Errorf("after a restart channel c's stats are %s, want depth 1", b.String())
	}
	n.Close()
	if _, err := http.Get("http://" + n.HTTPAddr() + "/ping"); err == nil {
		t.Errorf("nsqd answers after Close")
	}
}
