package kinesisbus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	c := open(t, testURL(""))
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
	c := open(t, testURL(""))
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
