package main

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestWrongProtocolFailsFast: a URL whose scheme does not speak what
// listens on its port fails within a few seconds, saying what it found
// there and what to use, instead of waiting for the open timeout.
func TestWrongProtocolFailsFast(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kafka := c.ListenAddrs()[0]
	nats := serverURL(t, "127.0.0.1:4222", "127.0.0.1:4222", startNATS)
	rabbit := serverURL(t, "127.0.0.1:5672", "127.0.0.1:5672", startRabbit)
	redis := serverURL(t, "127.0.0.1:6379", "127.0.0.1:6379", startRedis)
	nsqURL, _ := nsqTopic(t)
	u, err := url.Parse(nsqURL)
	if err != nil {
		t.Fatal(err)
	}
	nsqd := u.Host
	tests := []struct{ url, want string }{
		{"kafkas://" + kafka, "speaks plain Kafka, not TLS (use kafka://)"},
		{"nats://" + kafka, "speaks plain Kafka, not NATS (is the port right?"},
		{"amqp://guest:guest@" + kafka + "/", "speaks plain Kafka, not AMQP 0-9-1 (RabbitMQ)"},
		{"amqps://guest:guest@" + rabbit + "/", "speaks AMQP 0-9-1 (RabbitMQ), not TLS (use amqp://)"},
		{"nats://" + rabbit, "speaks AMQP 0-9-1 (RabbitMQ), not NATS"},
		{"kafka://" + rabbit, "speaks AMQP 0-9-1 (RabbitMQ), not plain Kafka"},
		{"kafka://" + nats, "speaks NATS, not plain Kafka"},
		{"amqp://guest:guest@" + nats + "/", "speaks NATS, not AMQP 0-9-1 (RabbitMQ)"},
		{"redis://" + kafka, "speaks plain Kafka, not Redis (RESP)"},
		{"redis://" + rabbit, "speaks AMQP 0-9-1 (RabbitMQ), not Redis (RESP)"},
		{"redis://" + nats, "speaks NATS, not Redis (RESP)"},
		{"redis://" + nsqd, "speaks NSQ (TCP), not Redis (RESP)"},
		{"nsq://" + kafka, "speaks plain Kafka, not NSQ (TCP)"},
		{"nsq://" + rabbit, "speaks AMQP 0-9-1 (RabbitMQ), not NSQ (TCP)"},
		{"nsq://" + nats, "speaks NATS, not NSQ (TCP)"},
		{"nsq://" + redis, "speaks Redis (RESP), not NSQ (TCP)"},
		{"nats://" + redis, "speaks Redis (RESP), not NATS"},
		{"kafka://" + nsqd, "speaks NSQ (TCP), not plain Kafka"},
		{"amqp://guest:guest@" + nsqd + "/", "speaks NSQ (TCP), not AMQP 0-9-1 (RabbitMQ)"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			r := runCmd(t, ctxT(t), nil, "x\n", "send", "--url", tt.url, "--topic", "t")
			wantCode(t, r, exitFailed)
			wantOneLineError(t, r, tt.want, "guest")
			if r.took > 5*time.Second {
				t.Errorf("took %v to fail", r.took)
			}
			t.Logf("failed in %v", r.took.Round(time.Millisecond))
			if strings.Count(r.stderr, strings.TrimPrefix(tt.url, "amqp://guest:guest@")) > 1 {
				t.Errorf("the URL shows more than once: %s", r.stderr)
			}
		})
	}
}
