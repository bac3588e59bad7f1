package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
)

// held counts the messages a server holds for a test's topic.
type held func(t testing.TB) int

// natsTopic is a fresh topic on the machine's NATS server, deleted at
// cleanup with its groups' buckets, and its message count.
func natsTopic(t testing.TB) (url, topic string, count held) {
	url = serverURL(t, "nats://127.0.0.1:4222", "127.0.0.1:4222", startNATS)
	topic = "omnibus-cli-" + shortID()
	js := func(t testing.TB, fn func(ctx context.Context, js jetstream.JetStream, stream string) error) error {
		nc, err := nats.Connect(url)
		if err != nil {
			return err
		}
		defer nc.Close()
		j, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := j.StreamNameBySubject(ctx, topic)
		if err != nil {
			return err
		}
		return fn(ctx, j, stream)
	}
	cleanNATS(t, topic) // partitioned too, with the groups' buckets
	return url, topic, func(t testing.TB) int {
		n := 0
		err := js(t, func(ctx context.Context, j jetstream.JetStream, stream string) error {
			s, err := j.Stream(ctx, stream)
			if err == nil {
				n = int(s.CachedInfo().State.Msgs)
			}
			return err
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Logf("count: %v", err)
		}
		return n
	}
}

// rabbitTopic is a fresh topic on the machine's RabbitMQ with a group
// queue that keeps what is published, deleted at cleanup with every
// group's queues, and that queue's depth.
func rabbitTopic(t testing.TB) (url, topic string, count held) {
	url = serverURL(t, "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", startRabbit)
	topic = "omnibus-cli-" + shortID()
	queue := topic + ":keep"
	ctx := ctxT(t)
	c, err := omnibus.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("keep"))
	if err != nil {
		t.Fatal(err)
	}
	k.Close()
	c.Close()
	ac, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ac.Close() })
	cleanRabbit(t, topic) // the exchange, and every group's queues
	return url, topic, func(t testing.TB) int {
		ch, err := ac.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
}

// deleteExchange deletes topic's exchange from the RabbitMQ at url.
func deleteExchange(t testing.TB, url, topic string) {
	ac, err := amqp.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer ac.Close()
	if ch, err := ac.Channel(); err == nil {
		_ = ch.ExchangeDelete(topic, false, false)
	}
}

// serverTopic names a transport and gives a URL of it and a fresh topic.
type serverTopic struct {
	name string
	url  func(t testing.TB) (url, topic string)
}

// onEveryTransport are the transports of the machine's servers (and
// kfake), each with a fresh topic; partitioned NATS with partitions
// lanes.
func onEveryTransport(partitions int) []serverTopic {
	return []serverTopic{
		{"kafka", func(t testing.TB) (string, string) { return kafkaURL(t), "t-" + shortID() }},
		{"nats", func(t testing.TB) (string, string) { u, topic, _ := natsTopic(t); return u, topic }},
		{"nats partitioned", func(t testing.TB) (string, string) {
			u, topic, _ := natsTopic(t)
			return u + "?partitions=" + strconv.Itoa(partitions) + "&lease_ttl=1s&rebalance_interval=100ms", topic
		}},
		{"rabbitmq", func(t testing.TB) (string, string) { u, topic, _ := rabbitTopic(t); return u, topic }},
		{"nsq", nsqTopic},
		{"redis", func(t testing.TB) (string, string) {
			topic := "omnibus-cli-" + shortID()
			return redisURL(t, "?claim_idle=1s", topic), topic
		}},
		{"redis partitioned", func(t testing.TB) (string, string) {
			topic := "omnibus-cli-" + shortID()
			return redisURL(t, "?partitions="+strconv.Itoa(partitions)+"&lease_ttl=2s&rebalance_interval=100ms", topic), topic
		}},
	}
}

var sendSummary = regexp.MustCompile(`^sent (\d+), failed (\d+)(?:, unconfirmed (\d+))?(?:, not sent (\d+))?, `)

// TestSendInterruptCountsWhatLanded: Ctrl-C in the middle of a send
// reports every message that landed as sent, none as failed, and any
// whose outcome it could not learn as unconfirmed; the counts add up.
func TestSendInterruptCountsWhatLanded(t *testing.T) {
	for name, topicOn := range map[string]func(testing.TB) (string, string, held){"nats": natsTopic, "rabbitmq": rabbitTopic} {
		t.Run(name, func(t *testing.T) {
			url, topic, count := topicOn(t)
			const total = 1_000_000
			ctx, cancel := context.WithCancel(ctxT(t))
			go func() { // Ctrl-C once messages land
				defer cancel()
				for ctx.Err() == nil && count(t) < 2000 {
					time.Sleep(10 * time.Millisecond)
				}
			}()
			r := runCmd(t, ctx, nil, "", "send", "--url", url, "--topic", topic, "--count", strconv.Itoa(total), "--size", "16", "--batch", "500")
			wantCode(t, r, exitInterrupted)
			m := sendSummary.FindStringSubmatch(r.stdout)
			if m == nil {
				t.Fatalf("summary %q", r.stdout)
			}
			n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
			sent, failed, unconfirmed, notSent := n(1), n(2), n(3), n(4)
			if sent+failed+unconfirmed+notSent != total {
				t.Errorf("%q: the counts add up to %d, want %d", r.stdout, sent+failed+unconfirmed+notSent, total)
			}
			var got int
			eventually(t, 10*time.Second, func() error {
				if got = count(t); got < sent || got > sent+unconfirmed {
					return fmt.Errorf("the topic holds %d messages, want %d sent (+ up to %d unconfirmed)", got, sent, unconfirmed)
				}
				return nil
			})
			if failed != 0 {
				t.Errorf("%q: %d failed, want 0 (the topic holds %d)", r.stdout, failed, got)
			}
			t.Logf("%s; the topic holds %d", r.stdout, got)
		})
	}
}

// eventually polls fn until it returns nil or timeout passes.
func eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSendSaysWhatWasNotTried: a publish error that ends send (the
// connection dropped) counts its batch as unconfirmed and says how many
// messages were never tried.
func TestSendSaysWhatWasNotTried(t *testing.T) {
	r := runCmd(t, ctxT(t), nil, "", "send", "--url", "dropping://"+shortID(), "--topic", "t", "--count", "1000", "--batch", "100")
	wantCode(t, r, exitFailed)
	if !strings.HasPrefix(r.stdout, "sent 200, failed 0, unconfirmed 100, not sent 700, ") {
		t.Errorf("summary %q, want 200 sent, 100 unconfirmed, 700 not sent", r.stdout)
	}
	wantOneLineError(t, r, "100 message(s) unconfirmed: they may have landed, check before sending them again; 700 message(s) not sent: ", "")
	wantOneLineError(t, r, "connection reset by peer", "")

	r = runCmd(t, ctxT(t), nil, strings.Repeat("line\n", 250), "send", "--url", "dropping://"+shortID(), "--topic", "t", "--batch", "100")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "the rest of standard input was not sent", "")
}
