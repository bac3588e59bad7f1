package main

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
)

// benchServer is a transport bench runs on in the tests: a URL of its
// server, a topic of the user's on it (removed at the end) and the count
// of its messages (nil where the server keeps them for groups only, NSQ,
// or cannot count them, Kinesis), and what the server holds, as the
// transport's own client reads it.
type benchServer struct {
	name string
	url  func(t testing.TB) (raw, topic string, messages held)
	// holds lists what the server holds whose name starts with prefix
	// (a topic's streams, keys, queues, tables, KV buckets, and those of
	// the raw baseline's topic, named after it), with the groups and
	// consumers named after group anywhere.
	holds func(t testing.TB, raw, prefix, group string) []string
}

func benchServers() []benchServer {
	natsURL := func(params string) func(t testing.TB) (string, string, held) {
		return func(t testing.TB) (string, string, held) {
			raw := serverURL(t, "nats://127.0.0.1:4222"+params, "127.0.0.1:4222", startNATS)
			topic := "omnibus-cli-" + shortID()
			cleanNATS(t, topic)
			return raw, topic, func(t testing.TB) int { return natsMessages(t, raw, topic) }
		}
	}
	redisServer := func(params string) func(t testing.TB) (string, string, held) {
		return func(t testing.TB) (string, string, held) {
			topic := "omnibus-cli-" + shortID()
			return redisURL(t, params, topic), topic, func(t testing.TB) int { return redisMessages(t, topic) }
		}
	}
	return []benchServer{
		{"kafka", func(t testing.TB) (string, string, held) {
			raw, topic := kafkaURL(t), "t-"+shortID()
			return raw, topic, func(t testing.TB) int { return kafkaMessages(t, raw, topic) }
		}, kafkaHolds},
		{"nats", natsURL(""), natsHolds},
		{"nats partitioned", natsURL("?partitions=4&lease_ttl=1s&rebalance_interval=100ms"), natsHolds},
		{"rabbitmq", rabbitTopic, rabbitHolds},
		{"redis", redisServer(""), redisHolds},
		{"redis partitioned", redisServer("?partitions=4&lease_ttl=2s&rebalance_interval=100ms"), redisHolds},
		{"nsq", func(t testing.TB) (string, string, held) { raw, topic := nsqTopic(t); return raw, topic, nil }, nsqHolds},
		{"kinesis", func(t testing.TB) (string, string, held) {
			topic := "omnibus-cli-" + shortID()
			return kinesisURL(t, topic), topic, nil
		}, kinesisHolds},
	}
}

// removeThrough removes topic, group (when not empty) and the raw
// baseline's topic through omnibus: the tests' cleanup, should bench
// fail to.
func removeThrough(t testing.TB, raw, topic, group string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, raw)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer c.Close()
	r := c.Driver().(topicDeleter)
	if group != "" {
		_ = r.DeleteGroup(ctx, topic, group)
	}
	_ = r.DeleteTopic(ctx, topic)
	_ = r.DeleteTopic(ctx, topic+"-raw")
}

// TestBenchRemovesWhatItMade: on every server, bench on a fresh topic
// leaves nothing there, its raw baseline included; bench on a topic of
// the user's leaves the topic with bench's messages and removes its
// group. What the server holds is read with the transport's own client,
// before and after.
func TestBenchRemovesWhatItMade(t *testing.T) {
	for _, s := range benchServers() {
		t.Run(s.name, func(t *testing.T) {
			raw, topic, messages := s.url(t)
			bench := func(args ...string) map[string]any {
				t.Helper()
				m := benchJSON(t, runCmd(t, ctxT(t), nil, "", append([]string{"bench", "--url", raw, "--count", "100", "--lanes", "2", "--json"}, args...)...))
				t.Cleanup(func() { removeThrough(t, raw, m["topic"].(string), m["group"].(string)) })
				if m["left"] != nil {
					t.Errorf("bench says it left %q", m["left"])
				}
				return m
			}
			// A raw baseline names what it makes after bench's topic,
			// except NATS's (omnibus_rawbench_<id>): what the server held
			// before is no leftover.
			before := s.holds(t, raw, "omnibus_rawbench_", "")
			m := bench()
			fresh := m["topic"].(string)
			eventually(t, 10*time.Second, func() error {
				left := s.holds(t, raw, fresh, m["group"].(string))
				for _, h := range s.holds(t, raw, "omnibus_rawbench_", "") {
					if !slices.Contains(before, h) {
						left = append(left, h)
					}
				}
				if len(left) > 0 {
					return fmt.Errorf("bench on a fresh topic left %v", left)
				}
				return nil
			})

			m = bench("--topic", topic, "--force") // rabbitTopic made it
			group := m["group"].(string)
			held := s.holds(t, raw, topic, group)
			if len(held) == 0 {
				t.Errorf("the user's topic %s is gone", topic)
			}
			for _, h := range held {
				if strings.Contains(h, group) || strings.Contains(h, topic+"-raw") {
					t.Errorf("bench on the user's topic left %s of its group %s or its raw baseline (the server holds %v)", h, group, held)
				}
			}
			if messages != nil {
				if n := messages(t); n != 200 {
					t.Errorf("the user's topic holds %d messages, want bench's 200", n)
				}
			}
		})
	}
}

// benchName is the name of a fresh topic of bench, and of its group.
var benchName = regexp.MustCompile(`omnibus-bench-[0-9a-f]{8}`)

// TestBenchRemovesWhatItMadeWhenItFails: bench interrupted (Ctrl-C while
// it publishes) or failing (consuming takes longer than --timeout)
// removes its topic and group all the same.
func TestBenchRemovesWhatItMadeWhenItFails(t *testing.T) {
	for _, s := range benchServers() {
		if s.name != "kafka" && s.name != "nats partitioned" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			raw, _, _ := s.url(t)
			for _, run := range []struct {
				name string
				code int
				args []string
				ctx  func() context.Context
			}{
				{"interrupted", exitInterrupted, []string{"--count", "100000000", "--batch", "10"}, func() context.Context {
					ctx, cancel := context.WithCancel(ctxT(t))
					time.AfterFunc(time.Second, cancel)
					return ctx
				}},
				// Messages larger than the server takes (1 MiB on both):
				// the publish fails once the topic and the group are made.
				// A consume timeout cannot be forced: a consumer that kept
				// up with the last batch (NATS partitioned did, with
				// 100,000 messages and --timeout 1ns) makes bench succeed.
				{"failed", exitFailed, []string{"--count", "10", "--size", "2000000"}, func() context.Context { return ctxT(t) }},
			} {
				before := s.holds(t, raw, "omnibus-bench-", "omnibus-bench-")
				r := runCmd(t, run.ctx(), nil, "", append([]string{"bench", "--url", raw}, run.args...)...)
				wantCode(t, r, run.code)
				if strings.Contains(r.stderr, "left on the transport") {
					t.Errorf("%s: bench says it left something: %s", run.name, r.stderr)
				}
				var left []string
				for _, h := range s.holds(t, raw, "omnibus-bench-", "omnibus-bench-") {
					if !slices.Contains(before, h) {
						left = append(left, h)
						if name := benchName.FindString(h); name != "" {
							t.Cleanup(func() { removeThrough(t, raw, name, name) })
						}
					}
				}
				if len(left) > 0 {
					t.Errorf("%s: bench left %v", run.name, left)
				}
			}
		})
	}
}

// TestBenchRefusesATopicInUse: on a topic that exists, bench refuses
// without --force; with it, it publishes there.
func TestBenchRefusesATopicInUse(t *testing.T) {
	raw, topic, count := natsTopic(t)
	wantCode(t, runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", topic, "--count", "3"), exitOK)
	r := runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "100", "--topic", topic)
	wantCode(t, r, exitUsage)
	wantOneLineError(t, r, `topic "`+topic+`" exists: its consumer groups would receive bench's 200 messages`, "")
	if n := count(t); n != 3 {
		t.Errorf("the topic holds %d messages after bench refused, want 3", n)
	}
	r = runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "100", "--topic", topic, "--force")
	wantCode(t, r, exitOK)
	if n := count(t); n != 203 {
		t.Errorf("the topic holds %d messages after --force, want 203", n)
	}
}

// withPrefix keeps the names that start with prefix, each after kind.
func withPrefix(kind, prefix string, names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, kind+" "+n)
		}
	}
	return out
}

// kafkaAdmin is an admin client of the cluster of raw, for one look (a
// new client: kadm caches metadata).
func kafkaAdmin(t testing.TB, raw string) *kadm.Client {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(u.Host, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func kafkaHolds(t testing.TB, raw, prefix, group string) []string {
	adm := kafkaAdmin(t, raw)
	tds, err := adm.ListTopics(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	gs, err := adm.ListGroups(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	held := withPrefix("topic", prefix, tds.Names())
	for _, g := range gs.Groups() {
		if g == group || strings.HasPrefix(g, prefix) {
			held = append(held, "group "+g)
		}
	}
	return held
}

func kafkaMessages(t testing.TB, raw, topic string) int {
	ends, err := kafkaAdmin(t, raw).ListEndOffsets(ctxT(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	return n
}

// natsJS is a jetstream client of the server of raw, closed at the end
// of t.
func natsJS(t testing.TB, raw string) jetstream.JetStream {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+u.Host, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func natsHolds(t testing.TB, raw, prefix, group string) []string {
	js := natsJS(t, raw)
	ctx := ctxT(t)
	var held []string
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		if !strings.HasPrefix(n, prefix) && !strings.HasPrefix(n, "KV_"+prefix) {
			continue
		}
		held = append(held, "stream "+n)
		s, err := js.Stream(ctx, n)
		if err != nil {
			continue // deleted since
		}
		consumers := s.ConsumerNames(ctx)
		for cn := range consumers.Name() {
			if group != "" && strings.HasPrefix(cn, group) {
				held = append(held, "consumer "+n+"/"+cn)
			}
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

func natsMessages(t testing.TB, raw, topic string) int {
	s, err := natsJS(t, raw).Stream(ctxT(t), topic) // a fresh topic's name is its stream's
	if err != nil {
		t.Fatal(err)
	}
	return int(s.CachedInfo().State.Msgs)
}

func rabbitHolds(t testing.TB, _, prefix, _ string) []string {
	var held []string
	for _, kind := range []string{"queue", "exchange"} {
		out, err := exec.Command("rabbitmqctl", "list_"+kind+"s", "-q", "--no-table-headers", "name").Output()
		if err != nil {
			t.Fatalf("rabbitmqctl list_%ss: %v", kind, err)
		}
		held = append(held, withPrefix(kind, prefix, strings.Fields(string(out)))...)
	}
	return held
}

// redisClient is a client of the tests' Redis server (redisURL's).
func redisClient(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func redisHolds(t testing.TB, _, prefix, _ string) []string {
	rdb := redisClient(t)
	ctx := ctxT(t)
	var held []string
	it := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		k := it.Val()
		held = append(held, "key "+k)
		if rdb.Type(ctx, k).Val() == "stream" {
			for _, g := range rdb.XInfoGroups(ctx, k).Val() {
				held = append(held, "group "+k+"/"+g.Name)
			}
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

func redisMessages(t testing.TB, topic string) int {
	rdb := redisClient(t)
	ctx := ctxT(t)
	n := 0
	for _, k := range append([]string{topic}, topic+":0", topic+":1", topic+":2", topic+":3") {
		n += int(rdb.XLen(ctx, k).Val())
	}
	return n
}

func nsqHolds(t testing.TB, _, prefix, _ string) []string {
	http := nsqServer.nsqd.HTTPAddr()
	topics, err := nsqtest.Topics(http)
	if err != nil {
		t.Fatal(err)
	}
	held := withPrefix("topic", prefix, topics)
	for _, topic := range topics {
		if strings.HasPrefix(topic, prefix) {
			channels, err := nsqtest.Channels(http, topic)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range channels {
				held = append(held, "channel "+topic+"/"+c)
			}
		}
	}
	return held
}

func kinesisHolds(t testing.TB, _, prefix, _ string) []string {
	ctx := ctxT(t)
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secretTEST", "")}
	kin := kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + kinesisAddr) })
	ddb := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String("http://" + dynamoAddr) })
	var held []string
	// kinesalite pages by the last name, without NextToken.
	in := &kinesis.ListStreamsInput{Limit: aws.Int32(10000)}
	for {
		out, err := kin.ListStreams(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, withPrefix("stream", prefix, out.StreamNames)...)
		if !aws.ToBool(out.HasMoreStreams) || len(out.StreamNames) == 0 {
			break
		}
		in.ExclusiveStartStreamName = aws.String(out.StreamNames[len(out.StreamNames)-1])
	}
	for ps := dynamodb.NewListTablesPaginator(ddb, &dynamodb.ListTablesInput{}); ps.HasMorePages(); {
		out, err := ps.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, withPrefix("table", prefix, out.TableNames)...)
	}
	return held
}
