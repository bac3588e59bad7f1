package redisbus_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// claimIdle is the claim_idle of the suite's URLs: short, so that
// handlers and queues outlast it.
const claimIdle = time.Second

// suiteParams are the URL parameters of every conformance run: a short
// claim_idle, and a size limit that keeps the suite's oversized message
// small (the server's own limit, 512 MiB, would be allocated whole).
const suiteParams = "claim_idle=1s&max_message_bytes=4194304"

// partitionedParams make the partitioned mode's leases react in test time.
const partitionedParams = "partitions=4&lease_ttl=2s&rebalance_interval=100ms"

func harness(rawURL string, lanes int) transporttest.Harness {
	return transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, rawURL)
			if err != nil {
				t.Fatalf("Open(%s): %v", omnibus.RedactURL(rawURL), err)
			}
			return c
		},
		Lanes:       lanes,
		AckDeadline: claimIdle,
		DeleteGroup: func(ctx context.Context, t testing.TB, topic, group string) {
			deleteGroup(ctx, t, rawURL, topic, group)
		},
	}
}

// deleteGroup destroys group on every stream of topic (XGROUP DESTROY),
// as an operator would, leaving the entries in place.
func deleteGroup(ctx context.Context, t testing.TB, rawURL, topic, group string) {
	t.Helper()
	rdb := raw(t, rawURL)
	parts, err := rdb.Get(ctx, topic+":partitions").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("layout of %q: %v", topic, err)
	}
	streams := []string{topic}
	if parts > 0 {
		streams = streams[:0]
		for p := range parts {
			streams = append(streams, topic+":"+strconv.Itoa(p))
		}
	}
	for _, st := range streams {
		n, err := rdb.XGroupDestroy(ctx, st, group).Result()
		if err != nil || n != 1 {
			t.Fatalf("XGROUP DESTROY %s %s: %d, %v", st, group, n, err)
		}
	}
	t.Logf("destroyed group %q on %v", group, streams)
}

// TestConformance runs the suite unpartitioned on a redis-server of its
// own, which the harness can restart (with its data) and make refuse
// acknowledgements (an ACL rule taking XACK from the user).
func TestConformance(t *testing.T) {
	srv := startPrivateServer(t, "--appendfsync", "everysec")
	h := harness(with(srv.url(), suiteParams, "dial_timeout=1s"), 1)
	h.Restart = func(ctx context.Context, t testing.TB) { srv.restart(100 * time.Millisecond) }
	h.FailCommits = func(t testing.TB) (restore func()) {
		rdb := raw(t, srv.url())
		acl := func(rule string) {
			if err := rdb.Do(context.Background(), "ACL", "SETUSER", "default", rule).Err(); err != nil {
				t.Errorf("ACL SETUSER default %s: %v", rule, err)
			}
		}
		acl("-xack")
		var once sync.Once
		return func() { once.Do(func() { acl("+xack") }) }
	}
	transporttest.Run(t, h)
}

func TestConformancePartitioned(t *testing.T) {
	u := serverURL(t)
	cleanupSuite(t, u)
	transporttest.Run(t, harness(with(u, suiteParams, partitionedParams), 4))
}

// TestFaults runs the fault suite unpartitioned on a redis-server of the
// test's own (an append-only file fsynced on every write), which the
// restart test stops and starts again on its data. A killed consumer's
// pending entries are claimed by the others after claim_idle.
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, faultHarness(""))
}

// TestFaultsPartitioned is TestFaults in partitioned mode: a killed
// consumer's lanes move once their leases (lease_ttl) expire.
func TestFaultsPartitioned(t *testing.T) {
	transporttest.RunFaults(t, faultHarness(partitionedParams))
}

func faultHarness(params string) func(t *testing.T) transporttest.Harness {
	return func(t *testing.T) transporttest.Harness {
		srv := startPrivateServer(t)
		u := with(srv.url(), "claim_idle=1s", "dial_timeout=1s")
		lanes := 1
		if params != "" {
			u += "&" + params
			lanes = 4
		}
		h := harness(u, lanes)
		h.URL = u
		h.Restart = func(ctx context.Context, t testing.TB) { srv.restart(100 * time.Millisecond) }
		return h
	}
}
