package kinesisbus_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// deletingFor is how long the kinesalite of slowKinesalite keeps a
// deleted stream in the DELETING state (its deleteStreamMs): long enough
// for a test to see it there on a machine loaded by -race.
const deletingFor = 3 * time.Second

// slowKinesalite starts a kinesalite of the test's own, in memory, on a
// free port of 127.0.0.1, that keeps a deleted stream DELETING for
// deletingFor (the shared one of scripts/test.sh, 20ms, too short to see
// it), and stops it at cleanup. It returns its address. It needs node and
// the kinesalite package scripts/test.sh installs in $OMNIBUS_NPM_DIR
// (default ~/.cache/omnibus-npm).
func slowKinesalite(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("OMNIBUS_NPM_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "omnibus-npm")
	}
	mod := filepath.Join(dir, "node_modules", "kinesalite")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(mod)
	}
	if err != nil {
		testenv.SkipOrFail(t, "missing kinesalite", "a kinesalite of the test's own needs node and "+mod+": "+err.Error()+" (scripts/test.sh installs them)")
	}
	script := "const s = require(" + jsString(mod) + ")({createStreamMs: 20, deleteStreamMs: " +
		strconv.FormatInt(deletingFor.Milliseconds(), 10) + ", updateStreamMs: 20});" +
		"s.listen(0, '127.0.0.1', () => console.log(s.address().port));"
	cmd := exec.Command(node, "-e", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kinesalite: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			port <- strings.TrimSpace(sc.Text())
		}
		close(port)
	}()
	select {
	case p, ok := <-port:
		if !ok || p == "" {
			t.Fatalf("kinesalite did not start: %s", stderr.String())
		}
		return "127.0.0.1:" + p
	case <-time.After(30 * time.Second):
		t.Fatalf("kinesalite did not say its port within 30s: %s", stderr.String())
	}
	return ""
}

func jsString(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

// TestTopicExistsDeleting: TopicExists says that a stream Kinesis is
// deleting (DELETING, as the raw client sees it) exists; DeleteTopic of
// such a stream waits until Kinesis no longer knows it, and TopicExists
// then says it does not exist.
func TestTopicExistsDeleting(t *testing.T) {
	need(t) // dynalite, for the client's lease tables
	kinAddr := slowKinesalite(t)
	c := transporttest.Open(t, kinesisURL(kinAddr, dynamoAddr, ""))
	r := c.Driver().(transporttest.Remover)
	ctx := ctxT(t)
	stream := testPrefix + "deleting-" + omnibus.NewID()[12:]
	if err := c.CreateTopic(ctx, stream, 1); err != nil {
		t.Fatal(err)
	}
	kin := kinesis.NewFromConfig(aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secretTEST", ""),
	}, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + kinAddr) })
	if _, err := kin.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(stream)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := kin.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatalf("the stream just deleted: %v; want it DELETING", err)
	}
	if s := out.StreamDescriptionSummary.StreamStatus; s != types.StreamStatusDeleting {
		t.Fatalf("the stream just deleted is %s; want DELETING", s)
	}
	if got, err := r.TopicExists(ctx, stream); err != nil || !got {
		t.Errorf("TopicExists(%q) of a DELETING stream = %v, %v; want true", stream, got, err)
	}
	if d := time.Since(start); d >= deletingFor {
		t.Fatalf("TopicExists took %v, beyond the %v the stream stays DELETING: it may have seen it gone", d, deletingFor)
	}
	if err := r.DeleteTopic(ctx, stream); err != nil {
		t.Fatalf("DeleteTopic(%q) of a DELETING stream: %v", stream, err)
	}
	if got, err := r.TopicExists(ctx, stream); err != nil || got {
		t.Errorf("TopicExists(%q) after DeleteTopic = %v, %v; want false", stream, got, err)
	}
}
