package kinesisbus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// throttler is an HTTP proxy in front of kinesalite (which enforces no
// throughput limits) that answers as Kinesis does when a shard's limits
// are exceeded: the first getRecords GetRecords calls fail with
// ProvisionedThroughputExceededException, and in the first putCalls
// PutRecords calls every third record is refused with that error code
// (the others are stored).
type throttler struct {
	mu          sync.Mutex
	getRecords  int
	putCalls    int
	refused     int         // records refused
	throttledAt []time.Time // GetRecords calls refused
}

func (th *throttler) serve(t testing.TB) string {
	target, _ := url.Parse("http://" + kinesisAddr)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := r.Header.Get("X-Amz-Target")
		th.mu.Lock()
		switch {
		case strings.HasSuffix(op, ".GetRecords") && th.getRecords > 0:
			th.getRecords--
			th.throttledAt = append(th.throttledAt, time.Now())
			th.mu.Unlock()
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"ProvisionedThroughputExceededException","message":"Rate exceeded for shard"}`)
			return
		case strings.HasSuffix(op, ".PutRecords") && th.putCalls > 0:
			th.putCalls--
			th.mu.Unlock()
			th.refuseSome(w, r, rp)
			return
		}
		th.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// refuseSome forwards a PutRecords call without every third record and
// answers with those records failed, in their places.
func (th *throttler) refuseSome(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
	body, _ := io.ReadAll(r.Body)
	var req map[string]json.RawMessage
	var records []json.RawMessage
	if json.Unmarshal(body, &req) != nil || json.Unmarshal(req["Records"], &records) != nil || len(records) < 3 {
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
		return
	}
	var kept []json.RawMessage
	for i, rec := range records {
		if i%3 != 2 {
			kept = append(kept, rec)
		}
	}
	req["Records"], _ = json.Marshal(kept)
	fwd, _ := json.Marshal(req)
	rec := httptest.NewRecorder()
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(fwd)), int64(len(fwd))
	r2.Header.Set("Content-Length", strconv.Itoa(len(fwd)))
	rp.ServeHTTP(rec, r2)
	var resp struct {
		FailedRecordCount int
		Records           []map[string]any
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &resp) != nil {
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return
	}
	out := make([]map[string]any, 0, len(records))
	j := 0
	for i := range records {
		if i%3 == 2 {
			out = append(out, map[string]any{"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "Rate exceeded for shard"})
			resp.FailedRecordCount++
			th.mu.Lock()
			th.refused++
			th.mu.Unlock()
			continue
		}
		out = append(out, resp.Records[j])
		j++
	}
	b, _ := json.Marshal(map[string]any{"FailedRecordCount": resp.FailedRecordCount, "Records": out})
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_, _ = w.Write(b)
}

// TestThrottling: records Kinesis refuses for throughput are sent again
// until they land (Publish succeeds, in order per key), and a reader
// whose GetRecords are throttled backs off and recovers: every message
// is handled.
func TestThrottling(t *testing.T) {
	need(t)
	t.Parallel()
	th := &throttler{getRecords: 4, putCalls: 4}
	addr := th.serve(t)
	u := kinesisURL(addr, dynamoAddr, "")
	c := transporttest.Open(t, u)
	stream := testPrefix + "throttle-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := c.CreateTopic(ctxT(t), stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	var ids []string
	for range 4 {
		ms := make([]*omnibus.Message, 300)
		for i := range ms {
			ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i%7), Body: []byte(strconv.Itoa(i))}
		}
		if err := c.Publish(ctxT(t), stream, ms...); err != nil {
			t.Fatalf("Publish with records refused for throughput: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	k, err := c.Subscribe(ctxT(t), stream, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		seen[m.ID] = true
		mu.Unlock()
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(ids)
	}, func() string { return fmt.Sprintf("handled %d of %d", len(seen), len(ids)) })
	th.mu.Lock()
	defer th.mu.Unlock()
	if th.refused == 0 || th.getRecords != 0 {
		t.Fatalf("refused %d records, %d throttled reads left: the test throttled nothing", th.refused, th.getRecords)
	}
	// One shard, one reader: its throttled calls are spaced by its
	// backoff, which doubles (jittered down by up to half) from 200ms.
	for i := 1; i < len(th.throttledAt); i++ {
		if gap := th.throttledAt[i].Sub(th.throttledAt[i-1]); gap < 90*time.Millisecond {
			t.Errorf("throttled read %d came %v after the one before: no backoff", i, gap)
		}
	}
	t.Logf("%d records refused and sent again; %d reads throttled over %v", th.refused, len(th.throttledAt),
		th.throttledAt[len(th.throttledAt)-1].Sub(th.throttledAt[0]).Round(time.Millisecond))
}
