package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestTailSaysTheTopicIsNew: tail on a topic that does not exist (a
// misspelt name) says it waits on a new topic; on a topic that exists it
// says nothing of the kind.
func TestTailSaysTheTopicIsNew(t *testing.T) {
	transports := map[string]func(testing.TB) (string, string){
		"embedded default": func(testing.TB) (string, string) { return "", "omnibus-cli-" + shortID() },
		"nats":             func(t testing.TB) (string, string) { u, topic, _ := natsTopic(t); return u, topic },
		"rabbitmq":         func(t testing.TB) (string, string) { u, topic, _ := rabbitTopic(t); return u, topic + "-typo" },
	}
	for name, topicOn := range transports {
		t.Run(name, func(t *testing.T) {
			raw, topic := topicOn(t)
			var url []string
			if raw != "" {
				url = []string{"--url", raw}
			}
			tail := func() result {
				ctx, cancel := context.WithTimeout(ctxT(t), 3*time.Second) // Ctrl-C after 3s
				defer cancel()
				return runCmd(t, ctx, nil, "", append([]string{"tail", "--topic", topic}, url...)...)
			}
			r := tail()
			wantCode(t, r, exitOK)
			if want := "topic \"" + topic + "\" does not exist yet (misspelt?)"; !strings.Contains(r.stderr, want) {
				t.Errorf("stderr %q, want it to say %q", r.stderr, want)
			}
			if strings.HasSuffix(topic, "-typo") {
				t.Cleanup(func() { deleteExchange(t, raw, topic) })
			}
			if r = tail(); strings.Contains(r.stderr, "does not exist") {
				t.Errorf("tail on the topic it created says %q", r.stderr)
			}
		})
	}
}

// TestBenchAndDemoLeaveNothingOnTheDefault: on the default URL, bench and
// demo run on a temporary store: the user's data directory keeps none of
// their topics.
func TestBenchAndDemoLeaveNothingOnTheDefault(t *testing.T) {
	topicRE := regexp.MustCompile(`topic (\S+?)[ ,:]`)
	var topics []string
	for _, args := range [][]string{
		{"bench", "--count", "200"},
		{"demo", "--orders", "100", "--rate", "0", "--work", "0s"},
	} {
		r := runCmd(t, ctxT(t), nil, "", args...)
		wantCode(t, r, exitOK)
		if strings.Contains(r.stdout, "left on the transport") {
			t.Errorf("%s on the default URL leaves something:\n%s", args[0], r.stdout)
		}
		m := topicRE.FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("%s names no topic:\n%s", args[0], r.stdout)
		}
		topics = append(topics, m[1])
	}
	c, err := omnibus.Open(ctxT(t), defaultURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range topics {
		if exists, err := c.Driver().(topicExister).TopicExists(ctxT(t), topic); err != nil || exists {
			t.Errorf("topic %q is in the user's data directory (%v)", topic, err)
		}
	}
}
