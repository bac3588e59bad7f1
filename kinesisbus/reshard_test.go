package kinesisbus_test

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// orderLog records what handlers saw: per key the sequence numbers in the
// order they were handled, per lane the first and last time one of its
// messages was handled.
type orderLog struct {
	mu          sync.Mutex
	seen        map[string]bool
	last        map[string]int // key -> highest sequence handled
	regressions []string
	first, end  map[string]time.Time // lane -> first and last handling
	dups        int
}

func newOrderLog() *orderLog {
	return &orderLog{seen: map[string]bool{}, last: map[string]int{}, first: map[string]time.Time{}, end: map[string]time.Time{}}
}

func (o *orderLog) handler(ctx context.Context, m *omnibus.Message) error {
	seq, _ := strconv.Atoi(string(m.Body))
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[m.ID] {
		o.dups++
	}
	o.seen[m.ID] = true
	if prev, ok := o.last[m.Key]; ok && seq < prev && len(o.regressions) < 10 {
		// An older message of the key after a newer one: redeliveries
		// come in order, from the last checkpoint, so this is a broken
		// order, not a duplicate.
		o.regressions = append(o.regressions, fmt.Sprintf("key %s: %d after %d (lane %s)", m.Key, seq, prev, m.Lane))
	}
	o.last[m.Key] = max(o.last[m.Key], seq)
	if _, ok := o.first[m.Lane]; !ok {
		o.first[m.Lane] = now
	}
	o.end[m.Lane] = now
	return nil
}

func (o *orderLog) unique() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen)
}

// TestReshardKeepsOrder publishes 20,000 messages over 200 keys while one
// shard is split and, later, the split's two children are merged, with
// two members of one group reading: nothing is lost, no key's message is
// handled after a newer one of the key, and no child shard is read before
// its parents were read to their end; the finished shards' leases are
// then deleted and stay deleted.
func TestReshardKeepsOrder(t *testing.T) {
	need(t)
	t.Parallel()
	const (
		total = 20000
		keys  = 200
		batch = 100
	)
	pub := transporttest.Open(t, testURL(""))
	stream := testPrefix + "reshard-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := pub.CreateTopic(ctxT(t), stream, 2); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	log := newOrderLog()
	var members []*omnibus.Consumer
	for range 2 {
		// Shard syncs every 2s: a finished lease, once deleted, must not
		// be created again by the next sync.
		c := transporttest.Open(t, testURL("shard_sync_interval=2s"))
		k, err := c.Subscribe(ctxT(t), stream, log.handler, omnibus.Group("reshard"), omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		t.Cleanup(func() { _ = k.Close() })
		transporttest.RunConsumer(t, k)
		members = append(members, k)
	}
	kin, _ := rawClients()
	ids := map[string]bool{}
	next := make([]int, keys)
	publish := func(n int) {
		for sent := 0; sent < n; sent += batch {
			ms := make([]*omnibus.Message, batch)
			for i := range ms {
				k := (sent + i) % keys
				ms[i] = &omnibus.Message{Key: "key-" + strconv.Itoa(k), Body: []byte(strconv.Itoa(next[k]))}
				next[k]++
			}
			if err := pub.Publish(ctxT(t), stream, ms...); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			for _, m := range ms {
				ids[m.ID] = true
			}
		}
	}
	publish(total * 3 / 10)

	// Split shard 0 in the middle of its hash range.
	shards := listShards(t, kin, stream)
	parent := shards[0]
	lo, _ := new(big.Int).SetString(*parent.HashKeyRange.StartingHashKey, 10)
	hi, _ := new(big.Int).SetString(*parent.HashKeyRange.EndingHashKey, 10)
	mid := new(big.Int).Rsh(new(big.Int).Add(lo, hi), 1)
	if _, err := kin.SplitShard(ctxT(t), &kinesis.SplitShardInput{
		StreamName: aws.String(stream), ShardToSplit: parent.ShardId, NewStartingHashKey: aws.String(mid.String()),
	}); err != nil {
		t.Fatalf("SplitShard: %v", err)
	}
	awaitShards(t, kin, stream, 4)
	publish(total * 4 / 10)

	// Merge the split's two children back into one.
	var children []types.Shard
	for _, s := range listShards(t, kin, stream) {
		if deref(s.ParentShardId) == *parent.ShardId {
			children = append(children, s)
		}
	}
	if len(children) != 2 {
		t.Fatalf("split of %s has %d children, want 2", *parent.ShardId, len(children))
	}
	if _, err := kin.MergeShards(ctxT(t), &kinesis.MergeShardsInput{
		StreamName: aws.String(stream), ShardToMerge: children[0].ShardId, AdjacentShardToMerge: children[1].ShardId,
	}); err != nil {
		t.Fatalf("MergeShards: %v", err)
	}
	awaitShards(t, kin, stream, 5)
	publish(total - total*7/10)

	transporttest.Eventually(t, 2*time.Minute, func() bool { return log.unique() >= len(ids) }, func() string {
		return fmt.Sprintf("received %d of %d messages", log.unique(), len(ids))
	})
	// Finished leases are cleaned up: once the children progressed, the
	// table holds the leases of the open shards alone (the split's parent
	// and the merge's parents are deleted), and a shard sync later they
	// are still gone.
	_, ddb := rawClients()
	openShards := map[string]bool{}
	for _, s := range listShards(t, kin, stream) {
		if s.SequenceNumberRange.EndingSequenceNumber == nil {
			openShards[*s.ShardId] = true
		}
	}
	leaseKeys := func() []string {
		out, err := ddb.Scan(ctxT(t), &dynamodb.ScanInput{TableName: aws.String(stream + ".reshard"), ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatalf("Scan: %v", err)
		}
		var keys []string
		for _, item := range out.Items {
			if v, ok := item["leaseKey"].(*ddbtypes.AttributeValueMemberS); ok {
				keys = append(keys, v.Value)
			}
		}
		slices.Sort(keys)
		return keys
	}
	onlyOpen := func(keys []string) bool {
		if len(keys) != len(openShards) {
			return false
		}
		for _, k := range keys {
			if !openShards[k] {
				return false
			}
		}
		return true
	}
	var lk []string
	transporttest.Eventually(t, time.Minute, func() bool { lk = leaseKeys(); return onlyOpen(lk) }, func() string {
		return fmt.Sprintf("lease table holds %v, want the open shards %v alone", lk, openShards)
	})
	time.Sleep(5 * time.Second) // shard syncs run
	if lk = leaseKeys(); !onlyOpen(lk) {
		t.Errorf("after more shard syncs the lease table holds %v, want the open shards %v alone", lk, openShards)
	}
	for _, k := range members {
		_ = k.Shutdown(ctxT(t))
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	missing := 0
	for id := range ids {
		if !log.seen[id] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d messages lost", missing, len(ids))
	}
	if len(log.regressions) > 0 {
		t.Errorf("key order broken:\n%s", strings.Join(log.regressions, "\n"))
	}
	// The barrier: every child read after its parents' last message.
	for _, s := range listShards(t, kin, stream) {
		for _, p := range []*string{s.ParentShardId, s.AdjacentParentShardId} {
			if p == nil {
				continue
			}
			child, parent := *s.ShardId, *p
			if first, ok := log.first[child]; ok && first.Before(log.end[parent]) {
				t.Errorf("child %s read at %v, before its parent %s ended at %v", child, first, parent, log.end[parent])
			}
		}
	}
	t.Logf("%d messages over %d keys through a split and a merge, %d redelivered; lanes read: %d", len(ids), keys, log.dups, len(log.first))
}

func listShards(t testing.TB, kin *kinesis.Client, stream string) []types.Shard {
	t.Helper()
	out, err := kin.ListShards(ctxT(t), &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatalf("ListShards: %v", err)
	}
	return out.Shards
}

// awaitShards waits until stream lists n shards and is ACTIVE again.
func awaitShards(t testing.TB, kin *kinesis.Client, stream string, n int) {
	t.Helper()
	transporttest.Eventually(t, 30*time.Second, func() bool {
		out, err := kin.DescribeStreamSummary(ctxT(t), &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
		return err == nil && out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive && len(listShards(t, kin, stream)) == n
	}, func() string { return fmt.Sprintf("stream never had %d shards", n) })
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
