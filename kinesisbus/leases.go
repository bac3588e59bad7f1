package kinesisbus

// The lease table in DynamoDB, in the KCL's schema: one item per shard,
// keyed by leaseKey (the shard ID), with leaseOwner, leaseCounter,
// checkpoint, checkpointSubSequenceNumber, ownerSwitchesSinceCheckpoint,
// parentShardId, checkpointOwner (a hand-over in progress, as KCL 3
// writes it), startingHashKey and endingHashKey. Every write that
// changes who holds a lease or where it is is conditional on the lease
// counter, the owner or both. These functions do I/O only; the members
// decide (balance.go, renew.go).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/omnibus-go/omnibus/driver"
)

// The KCL's attribute names.
const (
	attrKey             = "leaseKey"
	attrOwner           = "leaseOwner"
	attrCounter         = "leaseCounter"
	attrCheckpoint      = "checkpoint"
	attrSubSequence     = "checkpointSubSequenceNumber"
	attrOwnerSwitches   = "ownerSwitchesSinceCheckpoint"
	attrParents         = "parentShardId"
	attrCheckpointOwner = "checkpointOwner"
	attrStartingHashKey = "startingHashKey"
	attrEndingHashKey   = "endingHashKey"
	// attrStartTime is omnibus's own: the time in milliseconds an
	// AT_TIMESTAMP checkpoint starts at (the KCL keeps it in its
	// configuration).
	attrStartTime = "omnibusStartTime"
)

// The KCL's sentinel checkpoints.
const (
	TrimHorizon = "TRIM_HORIZON"
	Latest      = "LATEST"
	AtTimestamp = "AT_TIMESTAMP"
	ShardEnd    = "SHARD_END"
)

// restoredOwner is the leaseOwner of a lease created again after it
// vanished (its table was deleted under running members, and created
// again): no member's, it is taken only once it expired, as a lease whose
// holder stopped renewing it, so that a member still reading the shard
// under the lease that vanished finds out and stops first.
const restoredOwner = "omnibus-restored"

// ErrNotOwner is wrapped by a checkpoint, renewal or release refused
// because the member no longer holds the lease (another member took it,
// or it expired): such a write never lands.
var ErrNotOwner = errors.New("lease not held by this member")

// lease is one item of the lease table.
type lease struct {
	key             string
	owner           string
	counter         int64
	checkpoint      string
	subSequence     int64
	ownerSwitches   int64
	parents         []string
	checkpointOwner string
	startTime       int64
}

// ended reports whether the lease's shard was read to its end.
func (l *lease) ended() bool { return l.checkpoint == ShardEnd }

// table is a lease table.
type table struct {
	c    *conn
	name string
}

// ensure creates the table when it does not exist (on demand capacity,
// as the KCL creates it) and waits until it is ACTIVE; a table that
// exists must have the KCL's key, leaseKey of type string.
func (t *table) ensure(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, t.c.callTimeout())
		out, err := t.c.ddb.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.name)})
		cancel()
		switch {
		case errorCode(err) == codeNotFound:
			cctx, cancel := context.WithTimeout(ctx, t.c.callTimeout())
			_, err := t.c.ddb.CreateTable(cctx, &dynamodb.CreateTableInput{
				TableName:            aws.String(t.name),
				AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeS}},
				KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash}},
				BillingMode:          types.BillingModePayPerRequest,
			})
			cancel()
			if err != nil && errorCode(err) != codeInUse {
				return t.fail("create", err)
			}
		case err != nil:
			return t.fail("describe", err)
		default:
			if err := t.checkShape(out.Table); err != nil {
				return err
			}
			if out.Table.TableStatus == types.TableStatusActive || out.Table.TableStatus == types.TableStatusUpdating {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kinesisbus: lease table %q: waiting for it to become ACTIVE: %w", t.name, ctx.Err())
		case <-time.After(driver.Backoff(attempt, 20*time.Millisecond, time.Second)):
		}
	}
}

// checkShape refuses a table whose key is not the KCL's.
func (t *table) checkShape(d *types.TableDescription) error {
	ok := len(d.KeySchema) == 1 && deref(d.KeySchema[0].AttributeName) == attrKey && d.KeySchema[0].KeyType == types.KeyTypeHash
	for _, a := range d.AttributeDefinitions {
		if deref(a.AttributeName) == attrKey && a.AttributeType != types.ScalarAttributeTypeS {
			ok = false
		}
	}
	if ok {
		return nil
	}
	var keys []string
	for _, k := range d.KeySchema {
		keys = append(keys, fmt.Sprintf("%s (%s)", deref(k.AttributeName), k.KeyType))
	}
	return fmt.Errorf("kinesisbus: lease table %q has the key %v, not the KCL's leaseKey (string, HASH): name another table with lease_table: %w",
		t.name, keys, driver.ErrInvalid)
}

func (t *table) fail(op string, err error) error {
	err = t.c.classify(err)
	if errorCode(err) == codeAccessDenied {
		return fmt.Errorf("kinesisbus: lease table %q: %s: no permission (the member needs dynamodb:DescribeTable, CreateTable, Scan, GetItem, PutItem, UpdateItem, DeleteItem on it): %w", t.name, op, err)
	}
	return fmt.Errorf("kinesisbus: lease table %q: %s: %w", t.name, op, err)
}

// drop deletes the table (an ephemeral group's, when its last member
// leaves).
func (t *table) drop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.c.callTimeout())
	defer cancel()
	_, err := t.c.ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(t.name)})
	if err != nil && errorCode(err) != codeNotFound {
		return t.fail("delete", err)
	}
	return nil
}

// scan reads every lease, strongly consistent.
func (t *table) scan(ctx context.Context) ([]*lease, error) {
	var leases []*lease
	in := &dynamodb.ScanInput{TableName: aws.String(t.name), ConsistentRead: aws.Bool(true)}
	for {
		pctx, cancel := context.WithTimeout(ctx, t.c.callTimeout())
		out, err := t.c.ddb.Scan(pctx, in)
		cancel()
		if err != nil {
			return nil, t.fail("scan", err)
		}
		for _, item := range out.Items {
			if l, ok := fromItem(item); ok {
				leases = append(leases, l)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return leases, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// get reads one lease; nil when there is none.
func (t *table) get(ctx context.Context, key string) (*lease, error) {
	ctx, cancel := context.WithTimeout(ctx, t.c.leaseTimeout())
	defer cancel()
	out, err := t.c.ddb.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(t.name), Key: keyOf(key), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, t.fail("get "+key, err)
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	l, _ := fromItem(out.Item)
	return l, nil
}

// create writes a new lease for shard unless one exists, unowned or, for
// a lease that vanished, owned by restoredOwner; it reports whether it
// wrote one.
func (t *table) create(ctx context.Context, s shardInfo, owner, checkpoint string, startTime int64) (bool, error) {
	item := map[string]types.AttributeValue{
		attrKey:           str(s.id),
		attrCounter:       num(0),
		attrCheckpoint:    str(checkpoint),
		attrSubSequence:   num(0),
		attrOwnerSwitches: num(0),
	}
	if owner != "" {
		item[attrOwner] = str(owner)
	}
	if len(s.parents) > 0 {
		item[attrParents] = &types.AttributeValueMemberSS{Value: s.parents}
	}
	if s.start != "" {
		item[attrStartingHashKey], item[attrEndingHashKey] = str(s.start), str(s.end)
	}
	if checkpoint == AtTimestamp {
		item[attrStartTime] = num(startTime)
	}
	ctx, cancel := context.WithTimeout(ctx, t.c.leaseTimeout())
	defer cancel()
	_, err := t.c.ddb.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(t.name), Item: item,
		ConditionExpression: aws.String("attribute_not_exists(leaseKey)"),
	})
	if errorCode(err) == codeConditional {
		return false, nil
	}
	if err != nil {
		return false, t.fail("create lease "+s.id, err)
	}
	return true, nil
}

// take makes me the owner of l, if its counter is still the one read
// (the KCL's takeLease); it returns the new counter. A hand-over in
// progress is cancelled.
func (t *table) take(ctx context.Context, l *lease, me string) (int64, error) {
	update := "SET leaseOwner = :me, leaseCounter = :next REMOVE checkpointOwner"
	values := map[string]types.AttributeValue{":me": str(me), ":next": num(l.counter + 1), ":counter": num(l.counter)}
	if l.owner != "" && l.owner != me {
		update = "SET leaseOwner = :me, leaseCounter = :next, ownerSwitchesSinceCheckpoint = if_not_exists(ownerSwitchesSinceCheckpoint, :zero) + :one REMOVE checkpointOwner"
		values[":zero"], values[":one"] = num(0), num(1)
	}
	err := t.update(ctx, "take", l.key, update, "leaseCounter = :counter", values)
	return l.counter + 1, err
}

// handOver asks l's owner to hand it to me (the KCL's graceful hand-off):
// leaseOwner becomes me and checkpointOwner the owner, who drains,
// checkpoints and releases it. The counter is left alone, so the owner's
// renewals go on.
func (t *table) handOver(ctx context.Context, l *lease, me string) error {
	return t.update(ctx, "hand over", l.key,
		"SET leaseOwner = :me, checkpointOwner = :owner",
		"leaseOwner = :owner AND attribute_not_exists(checkpointOwner) AND leaseCounter = :counter",
		map[string]types.AttributeValue{":me": str(me), ":owner": str(l.owner), ":counter": num(l.counter)})
}

// ownerIs is the condition that me holds a lease whose counter is
// counter: as its owner, or as the checkpoint owner of a hand-over.
func ownerIs(handOver bool) string {
	if handOver {
		return "leaseCounter = :counter AND checkpointOwner = :me"
	}
	return "leaseCounter = :counter AND leaseOwner = :me AND attribute_not_exists(checkpointOwner)"
}

// renew increments the counter of a lease me holds.
func (t *table) renew(ctx context.Context, key string, counter int64, me string, handOver bool) error {
	return t.update(ctx, "renew", key, "SET leaseCounter = :next", ownerIs(handOver),
		map[string]types.AttributeValue{":me": str(me), ":next": num(counter + 1), ":counter": num(counter)})
}

// checkpoint stores the position of a lease me holds, conditional on the
// owner and the counter, so a member that lost the lease never moves it.
func (t *table) checkpoint(ctx context.Context, key string, counter int64, me string, handOver bool, position string, sub int64) error {
	return t.update(ctx, "checkpoint", key,
		"SET checkpoint = :cp, checkpointSubSequenceNumber = :sub, ownerSwitchesSinceCheckpoint = :zero, leaseCounter = :next",
		ownerIs(handOver),
		map[string]types.AttributeValue{
			":me": str(me), ":next": num(counter + 1), ":counter": num(counter),
			":cp": str(position), ":sub": num(sub), ":zero": num(0),
		})
}

// release gives up a lease me holds (the KCL's evictLease): it becomes
// unowned, or, in a hand-over, the new owner's.
func (t *table) release(ctx context.Context, key string, counter int64, me string, handOver bool) error {
	update := "SET leaseCounter = :next REMOVE leaseOwner"
	if handOver {
		update = "SET leaseCounter = :next REMOVE checkpointOwner"
	}
	return t.update(ctx, "release", key, update, ownerIs(handOver),
		map[string]types.AttributeValue{":me": str(me), ":next": num(counter + 1), ":counter": num(counter)})
}

// update runs one conditional UpdateItem; a failed condition is an error
// wrapping ErrNotOwner.
func (t *table) update(ctx context.Context, op, key, update, cond string, values map[string]types.AttributeValue) error {
	ctx, cancel := context.WithTimeout(ctx, t.c.leaseTimeout())
	defer cancel()
	_, err := t.c.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(t.name),
		Key:                       keyOf(key),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: values,
	})
	if errorCode(err) == codeConditional {
		return fmt.Errorf("kinesisbus: lease table %q: %s %s: %w", t.name, op, key, ErrNotOwner)
	}
	if err != nil {
		return t.fail(op+" "+key, err)
	}
	return nil
}

func keyOf(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: str(key)}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// fromItem reads a lease from an item; false when it has no leaseKey.
func fromItem(item map[string]types.AttributeValue) (*lease, bool) {
	l := &lease{}
	getS := func(name string) string {
		if v, ok := item[name].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		return ""
	}
	getN := func(name string) int64 {
		if v, ok := item[name].(*types.AttributeValueMemberN); ok {
			n, _ := strconv.ParseInt(v.Value, 10, 64)
			return n
		}
		return 0
	}
	if l.key = getS(attrKey); l.key == "" {
		return nil, false
	}
	l.owner = getS(attrOwner)
	l.counter = getN(attrCounter)
	l.checkpoint = getS(attrCheckpoint)
	l.subSequence = getN(attrSubSequence)
	l.ownerSwitches = getN(attrOwnerSwitches)
	l.checkpointOwner = getS(attrCheckpointOwner)
	l.startTime = getN(attrStartTime)
	switch v := item[attrParents].(type) {
	case *types.AttributeValueMemberSS:
		l.parents = slices.Clone(v.Value)
	case *types.AttributeValueMemberS:
		l.parents = []string{v.Value}
	}
	return l, true
}
