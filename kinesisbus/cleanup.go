package kinesisbus

// Cleanup of finished leases, as the KCL's LeaseCleanupManager does it:
// the lease of a shard read to its end (SHARD_END) is deleted once every
// child shard has a lease whose checkpoint is past its start (neither
// TRIM_HORIZON nor AT_TIMESTAMP) and none of its own parents has a lease
// left, or once the shard is gone from the stream and every child still
// listed has a lease. The children's barrier stays right: a child whose
// parent has no lease counts that parent as read (parentsDone), and the
// shard sync never leases a shard again whose descendant is leased
// (syncShards). Any member may delete; the delete is conditional on the
// SHARD_END checkpoint, so members racing to it are harmless. It runs in
// the taker, on the taker's state (listed). A lease still held (its
// member has not released it yet) waits for the next round.

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// cleanup deletes the finished leases it may and returns the others.
// fresh tells that listed was read in this round, so a shard it lacks is
// gone from the stream.
func (s *sub) cleanup(ctx context.Context, leases []*lease, fresh bool) ([]*lease, error) {
	if len(s.listed) == 0 {
		return leases, nil
	}
	byKey := make(map[string]*lease, len(leases))
	for _, l := range leases {
		byKey[l.key] = l
	}
	inStream := make(map[string]bool, len(s.listed))
	children := make(map[string][]string)
	for _, si := range s.listed {
		inStream[si.id] = true
		for _, p := range si.parents {
			children[p] = append(children[p], si.id)
		}
	}
	deleted := make(map[string]bool)
	for _, l := range leases {
		if !l.ended() || l.owner != "" || l.checkpointOwner != "" || !finished(l, byKey, inStream[l.key] || !fresh, children[l.key]) {
			continue
		}
		err := s.table.deleteEnded(ctx, l.key)
		if errors.Is(err, ErrNotOwner) {
			continue // deleted by another member, or not ended after all
		}
		if err != nil {
			return leases, err
		}
		deleted[l.key] = true
		s.logger.Info("deleted the lease of a finished shard", "shard", l.key, "gone", !inStream[l.key])
	}
	if len(deleted) == 0 {
		return leases, nil
	}
	kept := leases[:0:0]
	for _, l := range leases {
		if !deleted[l.key] {
			kept = append(kept, l)
		}
	}
	return kept, nil
}

// finished reports whether the ended lease l may be deleted: every child
// of its shard has a lease, past its start unless the shard is gone from
// the stream, and (for a shard still listed) no parent of l has a lease,
// so leases go parents first, as the KCL deletes them.
func finished(l *lease, byKey map[string]*lease, listed bool, children []string) bool {
	if listed && len(children) == 0 {
		return false // the listing does not show its children yet
	}
	for _, c := range children {
		cl := byKey[c]
		if cl == nil || listed && (cl.checkpoint == TrimHorizon || cl.checkpoint == AtTimestamp) {
			return false
		}
	}
	if listed {
		for _, p := range l.parents {
			if byKey[p] != nil {
				return false
			}
		}
	}
	return true
}

// deleteEnded deletes the lease of key if it is checkpointed SHARD_END;
// otherwise (or when there is none) the error wraps ErrNotOwner.
func (t *table) deleteEnded(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, t.c.leaseTimeout())
	defer cancel()
	_, err := t.c.ddb.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(t.name),
		Key:                       keyOf(key),
		ConditionExpression:       aws.String("checkpoint = :end"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":end": str(ShardEnd)},
	})
	if errorCode(err) == codeConditional {
		return fmt.Errorf("kinesisbus: lease table %q: delete %s: %w", t.name, key, ErrNotOwner)
	}
	if err != nil {
		return t.fail("delete lease "+key, err)
	}
	return nil
}
