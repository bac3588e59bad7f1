package main

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestKafkaNewTopicIsFast: sending to a topic that does not exist yet
// (created on first use) takes well under a second, not the 5s of
// franz-go's metadata minimum age.
func TestKafkaNewTopicIsFast(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw := "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?create_topics=all" // the default metadata settings
	for _, topic := range []string{"first", "second"} {
		r := runCmd(t, ctxT(t), nil, "x\n", "send", "--url", raw, "--topic", topic)
		wantCode(t, r, exitOK)
		if r.took > 2*time.Second {
			t.Errorf("send to the new topic %q took %v", topic, r.took)
		}
	}
}
