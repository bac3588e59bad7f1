package kinesisbus

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

func internalConn(t *testing.T) *conn {
	t.Helper()
	kin := testenv.Getenv("OMNIBUS_KINESIS_ADDR", "127.0.0.1:4567")
	ddb := testenv.Getenv("OMNIBUS_DYNAMODB_ADDR", "127.0.0.1:4568")
	testenv.Require(t, "kinesalite", kin, "scripts/test.sh")
	testenv.Require(t, "dynalite", ddb, "scripts/test.sh")
	u, _ := url.Parse("kinesis://AKIDTEST:secretTEST@us-east-1?endpoint=http://" + kin + "&dynamodb_endpoint=http://" + ddb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := Driver{}.Open(ctx, u, driver.OpenOptions{Logger: testLogger()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	return dc.(*conn)
}

// TestStaleCheckpointRefused: a member whose lease another member took
// (after it expired) cannot move the checkpoint, renew or release it.
func TestStaleCheckpointRefused(t *testing.T) {
	c := internalConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tb := &table{c: c, name: "kbi-stale-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if err := tb.ensure(ctx); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	t.Cleanup(func() { _ = tb.drop(context.Background()) })
	if _, err := tb.create(ctx, shardInfo{id: "shardId-000000000000"}, "", TrimHorizon, 0); err != nil {
		t.Fatalf("create: %v", err)
	}
	l, _ := tb.get(ctx, "shardId-000000000000")
	counterA, err := tb.take(ctx, l, "member-a")
	if err != nil {
		t.Fatalf("a takes: %v", err)
	}
	if err := tb.checkpoint(ctx, l.key, counterA, "member-a", false, "100", 0); err != nil {
		t.Fatalf("a checkpoints while it holds the lease: %v", err)
	}
	counterA++
	// member-b saw the counter stand still for failover_time and takes it.
	l, _ = tb.get(ctx, l.key)
	if _, err := tb.take(ctx, l, "member-b"); err != nil {
		t.Fatalf("b takes: %v", err)
	}
	for name, op := range map[string]func() error{
		"checkpoint": func() error { return tb.checkpoint(ctx, l.key, counterA, "member-a", false, "200", 0) },
		"renew":      func() error { return tb.renew(ctx, l.key, counterA, "member-a", false) },
		"release":    func() error { return tb.release(ctx, l.key, counterA, "member-a", false) },
	} {
		if err := op(); !errors.Is(err, ErrNotOwner) {
			t.Errorf("stale member's %s: got %v, want ErrNotOwner", name, err)
		}
	}
	got, _ := tb.get(ctx, l.key)
	if got.checkpoint != "100" || got.owner != "member-b" || got.ownerSwitches != 1 {
		t.Errorf("lease after the stale writes: checkpoint %q owner %q switches %d, want 100, member-b, 1", got.checkpoint, got.owner, got.ownerSwitches)
	}
}

// TestTimeLag: the lag of a shard is how long the first record after the
// checkpoint has waited, at least MillisBehindLatest, 0 without one; and
// GroupLag computes it on the connection's clock (kinesalite reports
// MillisBehindLatest 0, so the clock is moved instead).
func TestTimeLag(t *testing.T) {
	arrived := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	rec := types.Record{ApproximateArrivalTimestamp: aws.Time(arrived)}
	for _, tt := range []struct {
		name   string
		now    time.Time
		out    kinesis.GetRecordsOutput
		wantMs int64
	}{
		{"caught up", arrived.Add(time.Hour), kinesis.GetRecordsOutput{MillisBehindLatest: aws.Int64(0)}, 0},
		{"waited 5s", arrived.Add(5 * time.Second), kinesis.GetRecordsOutput{Records: []types.Record{rec}, MillisBehindLatest: aws.Int64(0)}, 5000},
		{"behind more than waited", arrived.Add(time.Second), kinesis.GetRecordsOutput{Records: []types.Record{rec}, MillisBehindLatest: aws.Int64(7000)}, 7000},
		{"clock behind the server", arrived.Add(-time.Second), kinesis.GetRecordsOutput{Records: []types.Record{rec}}, 0},
	} {
		if got := timeLag(tt.now, &tt.out); got != tt.wantMs {
			t.Errorf("%s: lag %dms, want %dms", tt.name, got, tt.wantMs)
		}
	}

	c := internalConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := "kbi-lag-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := c.CreateTopic(ctx, stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	t.Cleanup(func() {
		_, _ = c.kin.DeleteStream(context.Background(), &kinesis.DeleteStreamInput{StreamName: aws.String(stream)})
	})
	tb := &table{c: c, name: c.cfg.tableName(stream, "g")}
	if err := tb.ensure(ctx); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	t.Cleanup(func() { _ = tb.drop(context.Background()) })
	if _, err := tb.create(ctx, shardInfo{id: "shardId-000000000000"}, "", TrimHorizon, 0); err != nil {
		t.Fatalf("create: %v", err)
	}
	lags, err := c.GroupLag(ctx, stream, "g")
	if err != nil || len(lags) != 1 || !lags[0].Known || lags[0].Lag != 0 {
		t.Fatalf("empty stream: lag %+v, %v; want one known lane at 0", lags, err)
	}
	if err := c.Publish(ctx, stream, []*driver.Message{{ID: "a", Body: []byte("x")}}, driver.PublishOptions{}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	published := time.Now()
	c.clock = func() time.Time { return published.Add(10 * time.Minute) }
	lags, err = c.GroupLag(ctx, stream, "g")
	if err != nil || len(lags) != 1 || !lags[0].Known {
		t.Fatalf("lag %+v, %v", lags, err)
	}
	if want := (10 * time.Minute).Milliseconds(); lags[0].Lag < want-2000 || lags[0].Lag > want+2000 {
		t.Errorf("a record that waited 10 minutes: lag %dms, want about %dms", lags[0].Lag, want)
	}
	if _, err := c.GroupLag(ctx, stream, "nobody"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("lag of a group without a lease table: %v, want ErrNotFound", err)
	}
}

// testLogger discards below warnings.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
