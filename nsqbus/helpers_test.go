package nsqbus_test

import (
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The servers most tests share: an nsqlookupd and an nsqd registered
// with it, started by the first test that needs them, stopped by
// TestMain.
var shared struct {
	once    sync.Once
	dir     string
	lookupd *nsqtest.Lookupd
	nsqd    *nsqtest.NSQD
	err     error
}

// cluster returns the shared servers.
func cluster(t testing.TB) (*nsqtest.NSQD, *nsqtest.Lookupd) {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "nsqbus-test-")
		if shared.err != nil {
			return
		}
		shared.lookupd, shared.err = nsqtest.StartLookupdIn(shared.dir)
		if shared.err != nil {
			return
		}
		data := shared.dir + "/nsqd"
		if shared.err = os.Mkdir(data, 0o755); shared.err != nil {
			return
		}
		shared.nsqd, shared.err = nsqtest.Start(data, nsqtest.Config{Lookupd: shared.lookupd, MaxMsgSize: 2 << 20})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.nsqd, shared.lookupd
}

func stopShared() {
	if shared.nsqd != nil {
		shared.nsqd.Close()
	}
	if shared.lookupd != nil {
		shared.lookupd.Close()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

// testParams make consumers react in test time.
const testParams = "poll_interval=200ms&dial_timeout=2s"

// directURL is the shared nsqd's URL with the test parameters and params.
func directURL(t testing.TB, params ...string) string {
	n, _ := cluster(t)
	return n.URL(append([]string{testParams}, params...)...)
}

// lookupURL is the shared nsqlookupd's URL with the test parameters and
// params.
func lookupURL(t testing.TB, params ...string) string {
	_, l := cluster(t)
	u := "nsq://" + l.HTTPAddr() + "?lookup=true&" + testParams
	for _, p := range params {
		u += "&" + p
	}
	return u
}

// deleteSuiteTopics deletes, when t ends, the topics the conformance
// suite created on the shared nsqd.
func deleteSuiteTopics(t *testing.T) {
	n, _ := cluster(t)
	t.Cleanup(func() {
		if err := nsqtest.DeleteTopics(n.HTTPAddr(), transporttest.TopicPrefix()); err != nil {
			t.Errorf("delete the suite's topics: %v", err)
		}
	})
}

// deleteTopic deletes topic (and its dead-letter topic) from the shared
// nsqd.
func deleteTopic(t testing.TB, topic string) {
	n, _ := cluster(t)
	for _, name := range []string{topic, topic + ".dlq"} {
		if err := nsqtest.Post(n.HTTPAddr(), "/topic/delete", url.Values{"topic": {name}}); err != nil && !strings.Contains(err.Error(), "TOPIC_NOT_FOUND") {
			t.Errorf("delete topic %q: %v", name, err)
		}
	}
}

// postNSQD calls an nsqd API of a topic and channel at httpAddr.
func postNSQD(httpAddr, path, topic, channel string) error {
	return nsqtest.Post(httpAddr, path, url.Values{"topic": {topic}, "channel": {channel}})
}
