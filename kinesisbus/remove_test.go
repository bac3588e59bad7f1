package kinesisbus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/smithy-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a stream,
// DeleteGroup deletes the group's lease table and leaves the stream;
// DeleteTopic deletes the stream, as the raw SDK clients see them;
// removing them again is no error.
func TestDeleteTopicAndGroup(t *testing.T) {
	need(t)
	t.Parallel()
	c := transporttest.Open(t, testURL(""))
	ctx := ctxT(t)
	stream, group := testPrefix+"remove-"+omnibus.NewID()[12:], "g"
	table := stream + "." + group // lease_table's default, {stream}.{group}
	if err := c.CreateTopic(ctx, stream, 2); err != nil {
		t.Fatal(err)
	}
	transporttest.ConsumeSome(t, c, stream, group, 30)
	kin, ddb := rawClients()
	// missing tells whether err says the resource does not exist, and
	// fails the test on any other error.
	missing := func(err error) bool {
		t.Helper()
		var ae smithy.APIError
		if errors.As(err, &ae) && ae.ErrorCode() == "ResourceNotFoundException" {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	streamThere := func() bool {
		_, err := kin.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
		return !missing(err)
	}
	leases := func() int {
		out, err := ddb.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
		if missing(err) {
			return -1
		}
		return int(out.Count)
	}
	if !streamThere() || leases() != 2 {
		t.Fatalf("before removal: stream there %v, %d leases; want true, 2 (a table of them, one per shard)", streamThere(), leases())
	}
	transporttest.Remove(t, c, stream, group, func() {
		if !streamThere() || leases() != -1 {
			t.Errorf("after DeleteGroup: stream there %v, %d leases (-1: no table); want true, -1", streamThere(), leases())
		}
	})
	if streamThere() {
		t.Error("the stream is there after DeleteTopic")
	}
}

// TestDeleteGroupWithMember: DeleteGroup under a running member deletes
// the group's lease table; the member creates it again, in the KCL's
// schema, with a lease per shard, takes the leases back once they expired
// and reads on from where a new group starts (StartEarliest here:
// TRIM_HORIZON, so what it had handled comes again), losing nothing
// published after. Once the member stopped, DeleteGroup leaves no table,
// and the stream, as the raw SDK clients see them.
func TestDeleteGroupWithMember(t *testing.T) {
	need(t)
	t.Parallel()
	c := transporttest.Open(t, testURL(""))
	ctx := ctxT(t)
	stream, group := testPrefix+"busy-"+omnibus.NewID()[12:], "g"
	table := stream + "." + group // lease_table's default, {stream}.{group}
	kin, ddb := rawClients()
	t.Cleanup(func() { // DeleteUnderMember's cleanup does it too, once it runs
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = ddb.DeleteTable(cctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		_, _ = kin.DeleteStream(cctx, &kinesis.DeleteStreamInput{StreamName: aws.String(stream)})
	})
	if err := c.CreateTopic(ctx, stream, 2); err != nil {
		t.Fatal(err)
	}
	// back tells whether the lease table is there again, keyed by
	// leaseKey, with a lease per shard, each held by a member: the
	// member created it again and took its leases back. The messages
	// are published only then, so a member that stalls handles none.
	var got string
	back := func() bool {
		d, err := ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			got = err.Error()
			return false
		}
		if ks := d.Table.KeySchema; len(ks) != 1 || aws.ToString(ks[0].AttributeName) != "leaseKey" {
			got = fmt.Sprintf("key schema %+v", ks)
			return false
		}
		out, err := ddb.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
		if err != nil {
			got = err.Error()
			return false
		}
		var owners []string
		for _, item := range out.Items {
			if o, ok := item["leaseOwner"].(*ddbtypes.AttributeValueMemberS); ok {
				owners = append(owners, o.Value)
			} else {
				owners = append(owners, "")
			}
		}
		got = fmt.Sprintf("lease owners %q", owners)
		return len(owners) == 2 && !slices.Contains(owners, "") && !slices.Contains(owners, "omnibus-restored")
	}
	transporttest.DeleteUnderMember(t, c, stream, group, 30, transporttest.Busy{
		Deleted: func() {
			transporttest.Eventually(t, 30*time.Second, back, func() string {
				return "the lease table was not created again with its 2 leases held: " + got
			})
		},
		Gone: func() {
			_, err := ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
			var ae smithy.APIError
			if !errors.As(err, &ae) || ae.ErrorCode() != "ResourceNotFoundException" {
				t.Errorf("after DeleteGroup of the stopped member: DescribeTable(%q): %v; want ResourceNotFoundException", table, err)
			}
			if _, err := kin.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)}); err != nil {
				t.Errorf("after DeleteGroup of the stopped member: the stream: %v; want it there", err)
			}
		},
	})
}

// TestDeleteGroupTwoMembers: DeleteGroup under two members (each its own
// client, as two processes) holding 2 of 4 shards each, everything
// committed. Both find the table missing, or
// created again by the other, and neither claims a shard's lane while the
// other still has it (their engines' claimed, revoked and lost events, in
// the order they come): the leases created again are taken only once they
// expired, after the member that held them found out. The table comes
// back with every lease held, and every message published then is handled.
func TestDeleteGroupTwoMembers(t *testing.T) {
	need(t)
	t.Parallel()
	pub := transporttest.Open(t, testURL(""))
	ctx := ctxT(t)
	stream, group := testPrefix+"busy2-"+omnibus.NewID()[12:], "g"
	table := stream + "." + group
	kin, ddb := rawClients()
	t.Cleanup(func() { // after the members' cleanup, which stops them
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = ddb.DeleteTable(cctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		_, _ = kin.DeleteStream(cctx, &kinesis.DeleteStreamInput{StreamName: aws.String(stream)})
	})
	const shards = 4
	if err := pub.CreateTopic(ctx, stream, shards); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]bool{}
	has := map[string]int{} // lane: the member whose engine has it
	var overlaps []string
	handler := func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		handled[m.ID] = true
		mu.Unlock()
		return nil
	}
	observe := func(i int) func(omnibus.Event) {
		return func(e omnibus.Event) {
			mu.Lock()
			defer mu.Unlock()
			switch e.Kind {
			case omnibus.EventClaimed:
				for _, l := range e.Lanes {
					if h, ok := has[l]; ok && h != i {
						overlaps = append(overlaps, fmt.Sprintf("%s claimed by member %d while member %d has it", l, i, h))
					}
					has[l] = i
				}
			case omnibus.EventRevoked, omnibus.EventLost:
				for _, l := range e.Lanes {
					if has[l] == i {
						delete(has, l)
					}
				}
			}
		}
	}
	ks := make([]*omnibus.Consumer, 2)
	join := func(i int) {
		c := transporttest.Open(t, testURL(""))
		k, err := c.Subscribe(ctx, stream, handler, omnibus.Group(group), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Observe(observe(i)))
		if err != nil {
			t.Fatalf("Subscribe %d: %v", i, err)
		}
		ks[i] = k
		transporttest.RunConsumer(t, k)
	}
	publish := func(from, n int) []string {
		ms := make([]*omnibus.Message, n)
		ids := make([]string, n)
		for i := range ms {
			ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(from+i), Body: []byte("x")}
		}
		if err := pub.Publish(ctx, stream, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for i, m := range ms {
			ids[i] = m.ID
		}
		return ids
	}
	awaitHandled := func(ids []string) {
		t.Helper()
		missing := func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, id := range ids {
				if !handled[id] {
					n++
				}
			}
			return n
		}
		transporttest.Eventually(t, 30*time.Second, func() bool { return missing() == 0 },
			func() string { return fmt.Sprintf("%d of %d messages never handled", missing(), len(ids)) })
	}
	// The second member joins once the first has handled what came,
	// as a process started later: their renewals do not run in step,
	// and they find the deletion at different times.
	join(0)
	awaitHandled(publish(0, 20))
	join(1)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		h := holders(ks)
		return h[0] == shards/2 && h[1] == shards/2
	}, func() string {
		return fmt.Sprintf("lanes held %v; want %d each", holders(ks), shards/2)
	})
	awaitHandled(publish(20, 20))
	// Everything committed: the members find the table missing by their
	// renewals and scans, each at its own time, not by a commit both
	// make at once.
	var lags []omnibus.LaneLag
	transporttest.Eventually(t, 30*time.Second, func() bool {
		var err error
		if lags, err = ks[0].Lag(ctx); err != nil || len(lags) != shards {
			return false
		}
		for _, l := range lags {
			if !l.Known || l.Lag != 0 {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("lag never reached 0: %+v", lags) })

	if err := pub.Driver().(transporttest.Remover).DeleteGroup(ctx, stream, group); err != nil {
		t.Fatalf("DeleteGroup with two members running: %v", err)
	}
	var got []string
	transporttest.Eventually(t, 30*time.Second, func() bool {
		out, err := ddb.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
		if err != nil {
			got = []string{err.Error()}
			return false
		}
		got = got[:0]
		for _, item := range out.Items {
			o, _ := item["leaseOwner"].(*ddbtypes.AttributeValueMemberS)
			if o == nil || o.Value == "" || o.Value == "omnibus-restored" {
				return false
			}
			got = append(got, o.Value)
		}
		return len(got) == shards
	}, func() string {
		return fmt.Sprintf("the lease table is not back with its %d leases held: %v", shards, got)
	})
	awaitHandled(publish(40, 40))
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("a lane claimed by both members at once: %v", overlaps)
	}
}
