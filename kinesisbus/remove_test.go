package kinesisbus_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
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
