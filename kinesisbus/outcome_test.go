package kinesisbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// How spoiler spoils the answer to a PutRecords call it forwarded to
// kinesalite, which stored the records: the publisher cannot tell
// whether they landed.
const (
	spoilDrop  = "drop"  // the connection closes without an answer
	spoil500   = "500"   // InternalFailure, as Kinesis answers a failure inside
	spoil503   = "503"   // ServiceUnavailable
	spoilDelay = "delay" // the answer comes 2s late (after the caller's context ended)
)

// spoiler is an HTTP proxy in front of kinesalite. Every PutRecords call
// is forwarded and stored; the answers to the calls numbered in spoil
// (from 1) are then lost or replaced by a server error.
type spoiler struct {
	mu    sync.Mutex
	spoil map[int]string
	puts  int // PutRecords calls seen
}

func (sp *spoiler) serve(t testing.TB) string {
	target, _ := url.Parse("http://" + kinesisAddr)
	rp := httputil.NewSingleHostReverseProxy(target)
	// Connections of its own, closed after each call: none outlives the
	// test (the conformance suite, running beside, checks for leaks).
	rp.Transport = &http.Transport{DisableKeepAlives: true}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".PutRecords") {
			rp.ServeHTTP(w, r)
			return
		}
		sp.mu.Lock()
		sp.puts++
		how := sp.spoil[sp.puts]
		sp.mu.Unlock()
		if how == "" {
			rp.ServeHTTP(w, r)
			return
		}
		// Forwarded whatever the caller does meanwhile: the records
		// land.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r.Clone(context.WithoutCancel(r.Context())))
		if rec.Code != http.StatusOK {
			t.Errorf("spoiler: kinesalite answered a PutRecords call %d: %s", rec.Code, rec.Body)
		}
		switch how {
		case spoilDrop:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("spoiler: hijack: %v", err)
				return
			}
			_ = conn.Close()
		case spoil500, spoil503:
			code, status := "InternalFailure", http.StatusInternalServerError
			if how == spoil503 {
				code, status = "ServiceUnavailable", http.StatusServiceUnavailable
			}
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.Header().Set("X-Amzn-ErrorType", code)
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, `{"__type":%q,"message":"spoiled by the test"}`, code)
		case spoilDelay:
			time.Sleep(2 * time.Second)
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func (sp *spoiler) calls() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.puts
}

// newStream creates a one-shard stream for t, straight on kinesalite.
func newStream(t *testing.T, name string) string {
	t.Helper()
	stream := testPrefix + name + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := transporttest.Open(t, testURL("")).CreateTopic(ctxT(t), stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	return stream
}

// storedIDs reads stream from its start, behind omnibus's back, and
// counts the records of each message ID.
func storedIDs(t *testing.T, stream string) map[string]int {
	t.Helper()
	ctx := ctxT(t)
	kin, _ := rawClients()
	shards, err := kin.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatalf("ListShards: %v", err)
	}
	ids := map[string]int{}
	for _, sh := range shards.Shards {
		it, err := kin.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{
			StreamName: aws.String(stream), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon,
		})
		if err != nil {
			t.Fatalf("GetShardIterator: %v", err)
		}
		for iter := it.ShardIterator; iter != nil; {
			out, err := kin.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter})
			if err != nil {
				t.Fatalf("GetRecords: %v", err)
			}
			for _, r := range out.Records {
				var ev struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(r.Data, &ev); err != nil {
					t.Fatalf("record %s is not an event: %v", *r.SequenceNumber, err)
				}
				ids[ev.ID]++
			}
			if len(out.Records) == 0 {
				break
			}
			iter = out.NextShardIterator
		}
	}
	return ids
}

func driverMessages(n int) []*driver.Message {
	ms := make([]*driver.Message, n)
	for i := range ms {
		ms[i] = &driver.Message{ID: fmt.Sprintf("m%04d-%x", i, time.Now().UnixNano()), Key: "k" + strconv.Itoa(i%5), Time: time.Now(), Body: []byte("x")}
	}
	return ms
}

// TestPublishOutcomeUnknown: a PutRecords call whose answer is lost (the
// connection closes, or the answer comes after the publish's context
// ended) or is a server-side failure (500 InternalFailure, 503
// ServiceUnavailable), after kinesalite stored the records, is not sent
// again inside the driver: Publish fails those messages marked
// ErrOutcomeUnknown (not ErrRetryable, which says Kinesis cannot have
// acted), with one PutRecords call, and each record is in the stream
// once.
func TestPublishOutcomeUnknown(t *testing.T) {
	need(t)
	t.Parallel()
	for _, how := range []string{spoilDrop, spoil500, spoil503, spoilDelay} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			sp := &spoiler{spoil: map[int]string{1: how}}
			c := transporttest.Open(t, kinesisURL(sp.serve(t), dynamoAddr, ""))
			stream := newStream(t, "outcome-"+how)
			ctx := ctxT(t)
			if how == spoilDelay {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
			}
			ms := driverMessages(3)
			err := c.Driver().Publish(ctx, stream, ms, driver.PublishOptions{})
			if !errors.Is(err, driver.ErrOutcomeUnknown) || errors.Is(err, driver.ErrRetryable) {
				t.Errorf("Publish whose answer was %s: got %v, want an error marked ErrOutcomeUnknown and not ErrRetryable", how, err)
			}
			if how == spoilDelay && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Publish whose answer came after its context ended: got %v, want it to say so (DeadlineExceeded)", err)
			}
			if n := sp.calls(); n != 1 {
				t.Errorf("%d PutRecords calls; want 1: the driver sent the records again itself", n)
			}
			stored := storedIDs(t, stream)
			for _, m := range ms {
				if stored[m.ID] != 1 {
					t.Errorf("message %s stored %d times, want once", m.ID, stored[m.ID])
				}
			}
		})
	}
}

// TestPublishOutcomeUnknownBatches: in a publish of three PutRecords
// batches (500, 500 and 100 records) whose second answer is lost, the
// first batch's messages landed (no error), the second's fail marked
// ErrOutcomeUnknown, and the third is not sent (it would land before the
// second is sent again, out of its keys' order): its messages fail marked
// ErrRetryable. Nothing is sent twice.
func TestPublishOutcomeUnknownBatches(t *testing.T) {
	need(t)
	t.Parallel()
	sp := &spoiler{spoil: map[int]string{2: spoilDrop}}
	c := transporttest.Open(t, kinesisURL(sp.serve(t), dynamoAddr, ""))
	stream := newStream(t, "outcome-batches")
	ms := driverMessages(1100)
	err := c.Driver().Publish(ctxT(t), stream, ms, driver.PublishOptions{})
	var me *driver.MessageErrors
	if !errors.As(err, &me) || len(me.Errs) != len(ms) {
		t.Fatalf("Publish: got %v, want a *MessageErrors with %d entries", err, len(ms))
	}
	for i, e := range me.Errs {
		var ok bool
		switch {
		case i < 500:
			ok = e == nil
		case i < 1000:
			ok = errors.Is(e, driver.ErrOutcomeUnknown) && !errors.Is(e, driver.ErrRetryable)
		default:
			ok = errors.Is(e, driver.ErrRetryable) && !errors.Is(e, driver.ErrOutcomeUnknown)
		}
		if !ok {
			t.Fatalf("message %d: %v; want nil for 0-499, ErrOutcomeUnknown for 500-999, ErrRetryable (not sent) for 1000-1099", i, e)
		}
	}
	if n := sp.calls(); n != 2 {
		t.Errorf("%d PutRecords calls; want 2", n)
	}
	stored := storedIDs(t, stream)
	for i, m := range ms {
		if want := min(1, max(0, 1000-i)); stored[m.ID] != want {
			t.Fatalf("message %d stored %d times, want %d", i, stored[m.ID], want)
		}
	}
}

// resends records what PublishRetryHook reports.
type resends struct {
	mu  sync.Mutex
	ids map[string]int
	err []error
}

func (r *resends) OnPublishRetry(p omnibus.PublishRetry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range p.IDs {
		r.ids[id]++
	}
	r.err = append(r.err, p.Err)
}

// TestPublishResentVisibly: through omnibus, a publish whose outcome is
// unknown is sent again by Client.Publish, which logs it and tells the
// PublishRetryHook the IDs: every record that ends up in the stream twice
// is one of them. Publish succeeds.
func TestPublishResentVisibly(t *testing.T) {
	need(t)
	t.Parallel()
	for _, how := range []string{spoilDrop, spoil500} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			sp := &spoiler{spoil: map[int]string{1: how}}
			rs := &resends{ids: map[string]int{}}
			var logs testenv.Buffer
			c, err := omnibus.Open(ctxT(t), kinesisURL(sp.serve(t), dynamoAddr, ""),
				omnibus.WithHooks(rs), omnibus.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { _ = c.Close() })
			stream := newStream(t, "resent-"+how)
			ms := make([]*omnibus.Message, 50)
			for i := range ms {
				ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i%10), Body: []byte(strconv.Itoa(i))}
			}
			if err := c.Publish(ctxT(t), stream, ms...); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			stored := storedIDs(t, stream)
			rs.mu.Lock()
			defer rs.mu.Unlock()
			twice, lost, silent := 0, 0, 0
			for _, m := range ms {
				switch n := stored[m.ID]; {
				case n == 0:
					lost++
				case n > 1 && rs.ids[m.ID] == 0:
					silent++
				case n > 1:
					twice++
				}
			}
			if lost > 0 || silent > 0 {
				t.Errorf("of %d messages, %d lost and %d stored twice without a word that they were sent again", len(ms), lost, silent)
			}
			if twice != len(ms) || len(rs.err) != 1 || !errors.Is(rs.err[0], omnibus.ErrOutcomeUnknown) {
				t.Errorf("%d messages stored twice, resends reported %v; want all %d, sent again once after an unknown outcome",
					twice, rs.err, len(ms))
			}
			if got := logs.Lines("publishing again with the same IDs"); len(got) != 1 {
				t.Errorf("%d warnings of a publish sent again, want 1: %q", len(got), got)
			}
			if n := sp.calls(); n != 2 {
				t.Errorf("%d PutRecords calls, want 2", n)
			}
			if t.Failed() {
				t.Logf("the client's log:\n%s", strings.Join(logs.Lines(""), "\n"))
			}
		})
	}
}
