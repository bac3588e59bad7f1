package kinesisbus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// createKCLTable creates a lease table as the KCL does: leaseKey, a
// string, as the hash key, on-demand.
func createKCLTable(t testing.TB, ddb *dynamodb.Client, name, key string, keyType dtypes.ScalarAttributeType) {
	t.Helper()
	_, err := ddb.CreateTable(ctxT(t), &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []dtypes.AttributeDefinition{{AttributeName: aws.String(key), AttributeType: keyType}},
		KeySchema:            []dtypes.KeySchemaElement{{AttributeName: aws.String(key), KeyType: dtypes.KeyTypeHash}},
		BillingMode:          dtypes.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	transporttest.Eventually(t, 10*time.Second, func() bool {
		out, err := ddb.DescribeTable(ctxT(t), &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		return err == nil && out.Table.TableStatus == dtypes.TableStatusActive
	}, func() string { return "table never ACTIVE" })
}

// TestKCLTable: a lease table a Java KCL application wrote (its schema,
// its worker's leases, checkpoints in the middle of each shard) is picked
// up by omnibus at those checkpoints: once the KCL worker's leases expire
// (its counters stand still), the group goes on after each checkpoint,
// and checkpoints in the KCL's attributes as it reads.
func TestKCLTable(t *testing.T) {
	need(t)
	t.Parallel()
	kin, ddb := rawClients()
	stream := testPrefix + "kcl-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	tableName := testPrefix + "kcl-app-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	pub := transporttest.Open(t, testURL(""))
	if err := pub.CreateTopic(ctxT(t), stream, 2); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	const n = 200
	var all []*omnibus.Message
	for i := range n {
		all = append(all, &omnibus.Message{Key: "k" + strconv.Itoa(i%20), Body: []byte(strconv.Itoa(i))})
	}
	if err := pub.Publish(ctxT(t), stream, all...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// What the KCL application had processed: the first half of each
	// shard, checkpointed at its last record.
	createKCLTable(t, ddb, tableName, "leaseKey", dtypes.ScalarAttributeTypeS)
	want := map[string]bool{}
	for _, s := range listShards(t, kin, stream) {
		it, err := kin.GetShardIterator(ctxT(t), &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: s.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			t.Fatalf("GetShardIterator: %v", err)
		}
		out, err := kin.GetRecords(ctxT(t), &kinesis.GetRecordsInput{ShardIterator: it.ShardIterator})
		if err != nil || len(out.Records) < 2 {
			t.Fatalf("GetRecords: %d records, %v", len(out.Records), err)
		}
		half := len(out.Records) / 2
		for _, r := range out.Records[half:] {
			want[*r.SequenceNumber] = true
		}
		_, err = ddb.PutItem(ctxT(t), &dynamodb.PutItemInput{TableName: aws.String(tableName), Item: map[string]dtypes.AttributeValue{
			"leaseKey":                     &dtypes.AttributeValueMemberS{Value: *s.ShardId},
			"leaseOwner":                   &dtypes.AttributeValueMemberS{Value: "kcl-worker-1"},
			"leaseCounter":                 &dtypes.AttributeValueMemberN{Value: "42"},
			"checkpoint":                   &dtypes.AttributeValueMemberS{Value: *out.Records[half-1].SequenceNumber},
			"checkpointSubSequenceNumber":  &dtypes.AttributeValueMemberN{Value: "0"},
			"ownerSwitchesSinceCheckpoint": &dtypes.AttributeValueMemberN{Value: "0"},
			"startingHashKey":              &dtypes.AttributeValueMemberS{Value: *s.HashKeyRange.StartingHashKey},
			"endingHashKey":                &dtypes.AttributeValueMemberS{Value: *s.HashKeyRange.EndingHashKey},
		}})
		if err != nil {
			t.Fatalf("PutItem: %v", err)
		}
	}

	var mu sync.Mutex
	got := map[string]int{}
	c := transporttest.Open(t, testURL("lease_table="+tableName))
	k, err := c.Subscribe(ctxT(t), stream, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		got[m.Position]++
		mu.Unlock()
		return nil
	}, omnibus.Group("kcl-app"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	stop := transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(want)
	}, func() string {
		return fmt.Sprintf("received %d of the %d records after the checkpoints", len(got), len(want))
	})
	stop()
	mu.Lock()
	for pos := range got {
		if !want[pos] {
			t.Errorf("record %s, before the KCL's checkpoint, was delivered", pos)
		}
	}
	mu.Unlock()
	// The table is still the KCL's: omnibus's worker owns the leases,
	// the counters moved on, the checkpoints are the last records.
	out, err := ddb.Scan(ctxT(t), &dynamodb.ScanInput{TableName: aws.String(tableName), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	for _, item := range out.Items {
		key := item["leaseKey"].(*dtypes.AttributeValueMemberS).Value
		cp := item["checkpoint"].(*dtypes.AttributeValueMemberS).Value
		counter, _ := strconv.Atoi(item["leaseCounter"].(*dtypes.AttributeValueMemberN).Value)
		switches, _ := strconv.Atoi(item["ownerSwitchesSinceCheckpoint"].(*dtypes.AttributeValueMemberN).Value)
		if counter <= 42 || !want[cp] || switches != 0 {
			t.Errorf("lease %s after omnibus: counter %d, checkpoint %s (one of the records read: %v), ownerSwitchesSinceCheckpoint %d",
				key, counter, cp, want[cp], switches)
		}
	}
}

// TestWrongLeaseTable: a lease table of another shape (a key that is not
// the KCL's leaseKey string) is refused at Subscribe with ErrInvalid and a
// message naming the key it wants; dynalite has no permissions to deny,
// so this is the path a table the member cannot use takes.
func TestWrongLeaseTable(t *testing.T) {
	need(t)
	t.Parallel()
	_, ddb := rawClients()
	name := testPrefix + "wrong-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	createKCLTable(t, ddb, name, "id", dtypes.ScalarAttributeTypeN)
	c := transporttest.Open(t, testURL("lease_table="+name))
	stream := testPrefix + "wrongtable-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := c.CreateTopic(ctxT(t), stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	_, err := c.Subscribe(ctxT(t), stream, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if !errors.Is(err, omnibus.ErrInvalid) {
		t.Fatalf("Subscribe with a lease table of the wrong shape: %v, want ErrInvalid", err)
	}
	t.Logf("%v", err)
}

// TestMissingStream: publishing to or subscribing on a stream that does
// not exist is ErrNotFound, and creates nothing.
func TestMissingStream(t *testing.T) {
	need(t)
	t.Parallel()
	c := transporttest.Open(t, testURL(""))
	stream := testPrefix + "missing-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := c.Publish(ctxT(t), stream, &omnibus.Message{Body: []byte("x")}); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Publish to a missing stream: %v, want ErrNotFound", err)
	}
	_, err := c.Subscribe(ctxT(t), stream, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Subscribe to a missing stream: %v, want ErrNotFound", err)
	}
	kin, _ := rawClients()
	if _, err := kin.DescribeStreamSummary(ctxT(t), &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)}); err == nil {
		t.Errorf("the stream was created")
	}
}
