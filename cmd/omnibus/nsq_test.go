package main

import (
	"context"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
)

// The nsqd of the command's tests: a child process of the test binary
// (nsqtest), started by the first test that needs it, stopped by
// TestMain.
var nsqServer struct {
	once sync.Once
	dir  string
	nsqd *nsqtest.NSQD
	err  error
}

// nsqTopic returns the URL of the tests' nsqd and a fresh topic, deleted
// (with its dead-letter topic) when t ends.
func nsqTopic(t testing.TB) (string, string) {
	t.Helper()
	nsqServer.once.Do(func() {
		if nsqServer.dir, nsqServer.err = os.MkdirTemp("", "omnibus-cli-nsqd-"); nsqServer.err == nil {
			nsqServer.nsqd, nsqServer.err = nsqtest.Start(nsqServer.dir, nsqtest.Config{})
		}
	})
	if nsqServer.err != nil {
		t.Fatalf("nsqd: %v", nsqServer.err)
	}
	topic := "omnibus-cli-" + shortID()
	http := nsqServer.nsqd.HTTPAddr()
	t.Cleanup(func() {
		for _, name := range []string{topic, topic + ".dlq"} {
			_ = nsqtest.Post(http, "/topic/delete", url.Values{"topic": {name}})
		}
	})
	return nsqServer.nsqd.URL("poll_interval=200ms"), topic
}

func stopNSQ() {
	if nsqServer.nsqd != nil {
		nsqServer.nsqd.Close()
	}
	if nsqServer.dir != "" {
		_ = os.RemoveAll(nsqServer.dir)
	}
}

// TestNSQCommands: send, tail, lag and bench on an nsq:// URL.
func TestNSQCommands(t *testing.T) {
	raw, topic := nsqTopic(t)
	ctx := ctxT(t)
	// The group's channel exists before the messages come (NSQ keeps no
	// history for a new channel).
	c, err := omnibus.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	k.Close()
	c.Close()
	wantCode(t, runCmd(t, ctx, nil, "", "send", "--url", raw, "--topic", topic, "--count", "20", "--size", "8"), exitOK)
	r := runCmd(t, ctx, nil, "", "lag", "--url", raw, "--topic", topic, "--group", "g", "--json", "--samples", "1")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, `"total":20`) {
		t.Errorf("lag printed %q, want a total of 20", r.stdout)
	}
	r = runCmd(t, ctx, nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--max", "20", "--json")
	wantCode(t, r, exitOK)
	if ms := decodeLines(t, r.stdout); len(ms) != 20 {
		t.Errorf("tail printed %d messages, want 20", len(ms))
	}
	m := benchJSON(t, runCmd(t, ctx, nil, "", "bench", "--url", raw, "--topic", topic+"-bench", "--count", "500", "--size", "64", "--json"))
	if m["transport"] != "nsq" || m["publish_msgs_per_s"].(float64) <= 0 || m["consume_msgs_per_s"].(float64) <= 0 {
		t.Errorf("bench JSON %v: want transport nsq and rates", m)
	}
	if m["baseline"] != "go-nsq" || m["raw_publish_msgs_per_s"] == nil || m["raw_consume_msgs_per_s"] == nil {
		t.Errorf("bench JSON %v: want the go-nsq baseline's rates", m)
	}
	// bench leaves a topic of the user's (its raw baseline's it removes).
	_ = nsqtest.Post(nsqServer.nsqd.HTTPAddr(), "/topic/delete", url.Values{"topic": {topic + "-bench"}})
}
