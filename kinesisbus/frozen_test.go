package kinesisbus_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestFrozenConnections: the members' connections to DynamoDB, to
// Kinesis or to both stop answering for good (a proxy that forwards
// nothing on them, even after it forwards again on new connections: a
// path lost, as after a NAT or load balancer forgot it), for 2 x
// failover_time, while keyed records keep coming. No call may wait on
// such a connection for ever: once new connections are answered, the
// members take their leases again (the DynamoDB cases: they passed
// their deadlines) or read on (Kinesis), and handle every record, a
// record of a key never for the first time after a newer one of its key
// was settled, a record twice only on a shard whose lease moved. Then
// the connections freeze again, for good, and Shutdown must return
// within failover_time, leaving no goroutine of the members behind.
//
// In the last case DynamoDB answers again (on new connections) as soon
// as the member lost its leases at their deadline: it takes them back
// at its next look at the table, so the shards are read again within
// failover_time/2 and a little, without a release of the leases it could
// not renew.
//
// It times a stall, so it runs alone, before the parallel tests.
func TestFrozenConnections(t *testing.T) {
	need(t)
	for _, tc := range []struct {
		name       string
		members    int
		ddb, kin   bool
		thawAtLoss bool
	}{
		{"dynamodb, one member", 1, true, false, false},
		{"dynamodb and kinesis, every member", 2, true, true, false},
		{"kinesis, one member", 1, false, true, false},
		{"dynamodb until the leases are lost", 1, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testFrozen(t, tc.members, tc.ddb, tc.kin, tc.thawAtLoss) })
	}
}

func testFrozen(t *testing.T, members int, freezeDDB, freezeKin, thawAtLoss bool) {
	const failover = 3 * time.Second
	const shards = 4
	params := "failover_time=" + failover.String()
	pub := transporttest.Open(t, testURL(""))
	stream := testPrefix + "frozen-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := pub.CreateTopic(ctxT(t), stream, shards); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}

	type handling struct {
		member     int
		lane, id   string
		key        string
		seq        int
		start, end time.Time
	}
	var mu sync.Mutex
	var log []handling
	lost := map[string]bool{}        // lanes a member lost
	lostCh := make(chan struct{}, 1) // a member lost lanes
	ddbP, kinP := newProxy(t, dynamoAddr), newProxy(t, kinesisAddr)
	freeze := func() {
		if freezeDDB {
			ddbP.Freeze()
		}
		if freezeKin {
			kinP.Freeze()
		}
	}
	ks := make([]*omnibus.Consumer, members)
	clients := make([]*omnibus.Client, members)
	for i := range ks {
		handler := func(_ context.Context, m *omnibus.Message) error {
			start := time.Now()
			seq, _ := strconv.Atoi(string(m.Body))
			mu.Lock()
			log = append(log, handling{member: i, lane: m.Lane, id: m.ID, key: m.Key, seq: seq, start: start})
			n := len(log) - 1
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			log[n].end = time.Now()
			mu.Unlock()
			return nil
		}
		observe := omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventLost {
				mu.Lock()
				for _, l := range e.Lanes {
					lost[l] = true
				}
				mu.Unlock()
				select {
				case lostCh <- struct{}{}:
				default:
				}
			}
		})
		clients[i] = transporttest.Open(t, kinesisURL(kinP.Addr(), ddbP.Addr(), params))
		k, err := clients[i].Subscribe(ctxT(t), stream, handler, omnibus.Group("frozen"),
			omnibus.StartFrom(omnibus.StartEarliest), omnibus.CommitInterval(100*time.Millisecond), observe)
		if err != nil {
			t.Fatalf("Subscribe %d: %v", i, err)
		}
		t.Cleanup(func() { _ = k.Close() })
		ks[i] = k
		transporttest.RunConsumer(t, k)
	}
	held := func() int {
		n := 0
		for _, c := range holders(ks) {
			n += c
		}
		return n
	}

	// Keyed records all along: 8 keys every 50ms.
	stopPublishing := publishKeyed(t, pub, stream, 8)
	defer stopPublishing()

	transporttest.Eventually(t, 30*time.Second, func() bool { return held() == shards },
		func() string { return fmt.Sprintf("lanes per member %v, want %d in all", holders(ks), shards) })
	time.Sleep(time.Second)

	froze := time.Now()
	freeze()
	if thawAtLoss {
		select {
		case <-lostCh:
		case <-time.After(2 * failover):
			t.Fatalf("no lane lost %v after DynamoDB froze", 2*failover)
		}
	} else {
		time.Sleep(2 * failover)
	}
	ddbP.Thaw()
	kinP.Thaw()
	thawed := time.Now()

	// Every lease held again, and every record published until a
	// second after the thaw handled.
	transporttest.Eventually(t, 30*time.Second, func() bool { return held() == shards },
		func() string {
			return fmt.Sprintf("after the thaw: lanes per member %v, want %d in all", holders(ks), shards)
		})
	time.Sleep(time.Second)
	want := stopPublishing()
	firstTimes := func() map[string]time.Time {
		mu.Lock()
		defer mu.Unlock()
		first := map[string]time.Time{}
		for _, h := range log {
			if f, ok := first[h.id]; !ok || h.start.Before(f) {
				first[h.id] = h.start
			}
		}
		return first
	}
	transporttest.Eventually(t, 30*time.Second, func() bool {
		first := firstTimes()
		for _, id := range want {
			if _, ok := first[id]; !ok {
				return false
			}
		}
		return true
	}, func() string {
		first := firstTimes()
		missing := 0
		for _, id := range want {
			if _, ok := first[id]; !ok {
				missing++
			}
		}
		return fmt.Sprintf("%d of %d published records never handled (%v after the thaw)", missing, len(want), time.Since(thawed).Round(time.Millisecond))
	})
	caughtUp := time.Since(thawed)
	if thawAtLoss {
		// How long each lane lost was not read: from the loss to its
		// first record handled after it.
		var longest time.Duration
		mu.Lock()
		for lane := range lost {
			var first time.Time
			for _, h := range log {
				if h.lane == lane && h.start.After(thawed) && (first.IsZero() || h.start.Before(first)) {
					first = h.start
				}
			}
			if first.IsZero() {
				t.Errorf("lane %s, lost, never read again", lane)
			}
			longest = max(longest, first.Sub(thawed))
		}
		mu.Unlock()
		t.Logf("lanes lost at their deadline read again at most %v after the loss (failover_time %v)", longest.Round(time.Millisecond), failover)
		if longest > failover {
			t.Errorf("a lane lost at its deadline was read again only %v after the loss, want at most failover_time (%v)", longest.Round(time.Millisecond), failover)
		}
	}

	// Order within each key, and duplicates only on lanes lost.
	mu.Lock()
	byKey := map[string][]handling{}
	count := map[string]int{}
	for _, h := range log {
		byKey[h.key] = append(byKey[h.key], h)
		count[h.id]++
	}
	dups := 0
	for _, h := range log {
		if count[h.id] > 1 {
			dups++
			if !lost[h.lane] {
				t.Errorf("record %s of shard %s, whose lease never moved, handled %d times", h.id, h.lane, count[h.id])
			}
			count[h.id] = 0 // once per record
		}
	}
	late := 0
	for key, hs := range byKey {
		first := map[int]time.Time{}
		settled := map[int]time.Time{}
		for _, h := range hs {
			if f, ok := first[h.seq]; !ok || h.start.Before(f) {
				first[h.seq] = h.start
			}
			if s, ok := settled[h.seq]; !h.end.IsZero() && (!ok || h.end.Before(s)) {
				settled[h.seq] = h.end
			}
		}
		seqs := make([]int, 0, len(first))
		for seq := range first {
			seqs = append(seqs, seq)
		}
		slices.Sort(seqs)
		var newer time.Time // the earliest settling of a record newer than seqs[i]
		for i := len(seqs) - 1; i >= 0; i-- {
			if !newer.IsZero() && first[seqs[i]].After(newer) {
				late++
				if late <= 5 {
					t.Errorf("key %s: record %d first handled %v after a newer one was settled", key, seqs[i], first[seqs[i]].Sub(newer))
				}
			}
			if s, ok := settled[seqs[i]]; ok && (newer.IsZero() || s.Before(newer)) {
				newer = s
			}
		}
	}
	mu.Unlock()
	t.Logf("%d records published, all handled %v after the thaw (frozen %v); %d handled twice or more, lanes lost %d; %d first handled after a newer one of their key was settled",
		len(want), caughtUp.Round(time.Millisecond), thawed.Sub(froze).Round(time.Millisecond), dups, len(lost), late)

	// Frozen again, for good: Shutdown returns all the same.
	freeze()
	begin := time.Now()
	var wg sync.WaitGroup
	for i, k := range ks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = k.Shutdown(ctx) // what was not committed is read again: no error to check
			_ = clients[i].Close()
		})
	}
	wg.Wait()
	took := time.Since(begin)
	t.Logf("Shutdown with the connections frozen took %v", took.Round(time.Millisecond))
	if took > failover {
		t.Errorf("Shutdown with the connections frozen took %v, want at most failover_time (%v)", took.Round(time.Millisecond), failover)
	}
	transporttest.Eventually(t, 5*time.Second, func() bool { return membersGoroutines() == "" },
		func() string { return "goroutines of the members left after Shutdown:\n" + membersGoroutines() })
}

// membersGoroutines returns the stacks of the goroutines running
// kinesisbus's member code, "" when there are none.
func membersGoroutines() string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "kinesisbus.(*sub)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestFrozenPublish: a Publish whose context has no deadline, on a
// connection to Kinesis that stops answering for good (the proxy's
// freeze), must not wait for ever: each call is cut short after
// request_timeout, its records fail as of unknown outcome, and omnibus
// publishes them again on a new connection, which is answered once the
// proxy forwards again. Every message lands; one may land twice (a call
// cut short may have been stored), never zero times.
func TestFrozenPublish(t *testing.T) {
	need(t)
	kinP := newProxy(t, kinesisAddr)
	pub := transporttest.Open(t, kinesisURL(kinP.Addr(), dynamoAddr, "request_timeout=1s"))
	stream := testPrefix + "frozenpub-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := pub.CreateTopic(ctxT(t), stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	if err := pub.Publish(ctxT(t), stream, &omnibus.Message{ID: "before", Body: []byte("x")}); err != nil {
		t.Fatalf("Publish before the freeze: %v", err)
	}

	kinP.Freeze()
	done := make(chan error, 1)
	go func() {
		done <- pub.Publish(context.Background(), stream, &omnibus.Message{ID: "frozen", Body: []byte("x")})
	}()
	time.Sleep(3 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Publish returned while Kinesis answered nothing: %v", err)
	default:
	}
	kinP.Thaw()
	thawed := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Publish after the thaw: %v", err)
		}
		t.Logf("Publish returned %v after the thaw", time.Since(thawed).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("Publish still waiting 10s after Kinesis answered again (the call on the frozen connection was never cut short)")
	}

	var mu sync.Mutex
	seen := map[string]int{}
	k, err := transporttest.Open(t, testURL("")).Subscribe(ctxT(t), stream, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		seen[m.ID]++
		mu.Unlock()
		return nil
	}, omnibus.Group("frozenpub"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["before"] > 0 && seen["frozen"] > 0
	}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("handled %v, want before and frozen", seen)
	})
}
