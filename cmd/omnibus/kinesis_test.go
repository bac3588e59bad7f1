package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/omnibus-go/omnibus/dlq"
	"github.com/omnibus-go/omnibus/dlq/dlqtest"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The emulators scripts/test.sh starts for Kinesis: kinesalite and
// dynalite.
var (
	kinesisAddr = testenv.Getenv("OMNIBUS_KINESIS_ADDR", "127.0.0.1:4567")
	dynamoAddr  = testenv.Getenv("OMNIBUS_DYNAMODB_ADDR", "127.0.0.1:4568")
)

const startKinesis = "scripts/test.sh (kinesalite and dynalite from npm, on 127.0.0.1:4567 and :4568)"

// kinesisURL is a kinesis:// URL of the emulators that creates streams on
// first use, after arranging that the streams and lease tables whose
// names start with prefix are deleted at the test's end.
func kinesisURL(t testing.TB, prefix string) string {
	t.Helper()
	testenv.Require(t, "kinesalite", kinesisAddr, startKinesis)
	testenv.Require(t, "dynalite", dynamoAddr, startKinesis)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secretTEST", "")}
		kin := kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + kinesisAddr) })
		ddb := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String("http://" + dynamoAddr) })
		if out, err := kin.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(10000)}); err == nil {
			for _, s := range out.StreamNames {
				if strings.HasPrefix(s, prefix) {
					_, _ = kin.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(s)})
				}
			}
		}
		if out, err := ddb.ListTables(ctx, &dynamodb.ListTablesInput{}); err == nil {
			for _, name := range out.TableNames {
				if strings.HasPrefix(name, prefix) {
					_, _ = ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
				}
			}
		}
	})
	return "kinesis://AKIDTEST:secretTEST@us-east-1?endpoint=http://" + kinesisAddr + "&dynamodb_endpoint=http://" + dynamoAddr +
		"&create_streams=all&failover_time=3s&poll_interval=200ms"
}

// TestKinesisCommands: send, tail, lag and bench on a kinesis:// URL. The
// lag is a time (LAG(ms)), known on every shard the group leases.
func TestKinesisCommands(t *testing.T) {
	topic := "omnibus-cli-" + shortID()
	raw := kinesisURL(t, topic)
	wantCode(t, runCmd(t, ctxT(t), nil, "a\nb\nc\n", "send", "--url", raw, "--topic", topic, "--key", "x"), exitOK)
	r := runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--from", "earliest", "--max", "2", "--json")
	wantCode(t, r, exitOK)
	var bodies []string
	for _, m := range decodeLines(t, r.stdout) {
		bodies = append(bodies, m.Body)
	}
	if got := strings.Join(bodies, ""); got != "ab" {
		t.Errorf("tail read %q, want ab", got)
	}
	// One message waits: a known time lag on the one shard, in ms.
	var rep lagReport
	transporttest.Eventually(t, 30*time.Second, func() bool {
		r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", topic, "--group", "g", "--samples", "1", "--json")
		rep = lagReport{}
		return r.code == exitOK && json.Unmarshal([]byte(r.stdout), &rep) == nil && len(rep.Lanes) == 1 && rep.Lanes[0].Known
	}, func() string { return "lag: " + r.stdout + r.stderr })
	l := rep.Lanes[0]
	if rep.Unit != "ms" || rep.Total <= 0 || l.Lag != rep.Total || l.Age == nil || *l.Age*1000 < float64(l.Lag)-1 {
		t.Errorf("lag after reading 2 of 3: %s, want unit ms, a positive total equal to the lane's, and the lane's age", r.stdout)
	}
	r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", topic, "--group", "g", "--samples", "1")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "LAG(ms)") {
		t.Errorf("lag table %q: want the LAG(ms) heading", r.stdout)
	}
	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--max", "1", "--json")
	wantCode(t, r, exitOK)
	if ms := decodeLines(t, r.stdout); len(ms) != 1 || ms[0].Body != "c" {
		t.Errorf("tail read %q, want c", r.stdout)
	}
	transporttest.Eventually(t, 30*time.Second, func() bool {
		r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", topic, "--group", "g", "--samples", "1", "--json")
		rep = lagReport{}
		return r.code == exitOK && json.Unmarshal([]byte(r.stdout), &rep) == nil && len(rep.Lanes) == 1 && rep.Lanes[0].Known && rep.Total == 0
	}, func() string { return "every message read, yet lag: " + r.stdout + r.stderr })

	m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--topic", topic+"-bench", "--count", "500", "--lanes", "2", "--json"))
	if m["transport"] != "kinesis" || m["publish_msgs_per_s"].(float64) <= 0 || m["consume_msgs_per_s"].(float64) <= 0 {
		t.Errorf("bench JSON %v: want transport kinesis and rates", m)
	}
	if m["baseline"] != "aws-sdk-go-v2" || m["raw_publish_msgs_per_s"] == nil || m["raw_consume_msgs_per_s"] == nil {
		t.Errorf("bench JSON %v: want the aws-sdk-go-v2 baseline's rates", m)
	}
}

// TestKinesisDLQ: dlq list and replay on kinesis://: the dead letters are
// listed, replay --all hands each back to the service, and the
// dead-letter stream is then empty for the tools' group.
func TestKinesisDLQ(t *testing.T) {
	ctx := ctxT(t)
	ns := observetest.Namespace()
	raw := kinesisURL(t, ns)
	c := observetest.Open(t, raw)
	topic := ns + ".orders"
	if err := c.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	svc := dlqtest.Start(t, ctx, c, topic, "billing")
	const n = 60
	ids := svc.Publish(t, ctx, c, topic, n, func(i int) []byte { return fmt.Appendf(nil, `{"order":%d}`, i) })

	r := runCmd(t, ctx, nil, "", "dlq", "list", "--url", raw, "--topic", topic, "--json")
	wantCode(t, r, exitOK)
	seen := map[string]bool{}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	for dec.More() {
		var v dlq.View
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("list --json: %v", err)
		}
		if v.OriginTopic != topic || v.OriginGroup != "billing" || v.Reason == "" {
			t.Errorf("listed %+v: the failure is not told", v)
		}
		seen[v.ID] = true
	}
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("list --json printed %d dead letters, %s not among them; want all %d", len(seen), id, n)
		}
	}
	r = runCmd(t, ctx, nil, "", "dlq", "replay", "--url", raw, "--topic", topic, "--all", "--json")
	wantCode(t, r, exitOK)
	var p progressJSON
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.Replayed != n || p.Read != n {
		t.Errorf("replay --all --json: %s (%v); want %d replayed", r.stdout, err, n)
	}
	svc.AllowTwice(p.Republished)
	svc.WaitHandled(t, ids)
	r = runCmd(t, ctx, nil, "", "dlq", "list", "--url", raw, "--topic", topic)
	wantCode(t, r, exitOK)
	if r.stdout != "no dead letters in "+topic+".dlq\n" {
		t.Errorf("after replay --all: %q", r.stdout)
	}
}
