package natsbus

// Positions: a group's record of where each lane resumes, in a KV bucket
// without TTL, written on Subscribe, by the keeper, on hand-overs and on
// Close. No lock: conditional writes on the key's revision order the
// writers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// positions is a group's record of where each of its lanes resumes: the
// stream sequence after the lane's ack floor, kept in a KV bucket without
// TTL, one key per lane ("p.<lane>"). A JetStream consumer holds its
// position only while it exists; the record outlives it, so a consumer
// that is missing (deleted behind the group's back, removed by
// inactive_threshold, or lost between the delete and the create of a
// reset) is created again where the group left off, never at the end of
// the stream.
//
// The bucket itself may be deleted behind the group's back (DeleteGroup
// under a running member, an operator): restore creates it again, empty,
// when the member finds its consumer gone or a record fails, so that the
// member goes on, with redeliveries from the stream's first message
// rather than a loss.
//
// The record only rises: a write lower than what is stored is dropped,
// so a stale writer (a member whose lease ran out) cannot move it back. It
// may lag behind the consumer (it is written every recordEvery, when a
// member leaves or hands a lane over, and before a reset), which costs
// redeliveries after a consumer is re-created, never a loss.
type positions struct {
	c       *conn
	cfg     jetstream.KeyValueConfig // what restore creates
	created time.Time                // the stream's creation: records of an older stream of the same name are ignored

	mu sync.Mutex
	kv jetstream.KeyValue // the bucket as last opened; see bucket
}

// recordEvery is how often a member records the position of the lanes it
// reads.
const recordEvery = 5 * time.Second

// position is a lane's record as stored.
type position struct {
	// Next is the first stream sequence the lane has not had settled.
	Next uint64 `json:"next"`
	// StreamCreated identifies the stream the sequence belongs to.
	StreamCreated time.Time `json:"stream_created"`
}

func positionKey(lane string) string { return "p." + lane }

// encodePosition is the stored record of next on the stream created at
// created.
func encodePosition(next uint64, created time.Time) []byte {
	b, _ := json.Marshal(position{Next: next, StreamCreated: created}) // a struct of a number and a time
	return b
}

// decodePosition reads a stored record: ok is false when it is not one
// of the stream created at created (another stream of the same name, a
// value written by someone else, no position).
func decodePosition(b []byte, created time.Time) (next uint64, ok bool) {
	var pos position
	if json.Unmarshal(b, &pos) != nil || pos.Next == 0 || !pos.StreamCreated.Equal(created) {
		return 0, false
	}
	return pos.Next, true
}

// positions opens, or creates, the bucket of group's positions on ref.
func (c *conn) positions(ctx context.Context, ref *streamRef, group string) (*positions, error) {
	p := &positions{c: c, created: ref.created, cfg: jetstream.KeyValueConfig{
		Bucket:      positionBucket(ref.name, group),
		Description: "omnibus positions of group " + group + " on stream " + ref.name,
	}}
	if err := p.restore(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// bucket is the positions' KV bucket as last opened.
func (p *positions) bucket() jetstream.KeyValue {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kv
}

// restore opens the bucket again, creating it (empty) when it does not
// exist. Looking a bucket up answers at once, where a read of the keys
// of a deleted bucket may get no answer before ctx ends.
func (p *positions) restore(ctx context.Context) error {
	kv, err := p.c.bucket(ctx, p.cfg)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.kv = kv
	p.mu.Unlock()
	return nil
}

// bucket opens the KV bucket cfg names, or creates it as cfg says, with
// history 1 and the URL's storage and replicas.
func (c *conn) bucket(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg.History, cfg.Storage, cfg.Replicas = 1, c.cfg.storage, c.cfg.replicas
		kv, err = c.js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = c.js.KeyValue(ctx, cfg.Bucket) // created concurrently
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %q: %w", cfg.Bucket, classify(err))
	}
	return kv, nil
}

// get returns lane's recorded position and the key's revision; ok is
// false when there is none for this stream.
func (p *positions) get(ctx context.Context, lane string) (next, rev uint64, ok bool, err error) {
	e, err := p.bucket().Get(ctx, positionKey(lane))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, 0, false, nil // the bucket deleted behind the group's back: no record
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("position bucket %q: read lane %s: %w", p.cfg.Bucket, lane, classify(err))
	}
	next, ok = decodePosition(e.Value(), p.created)
	if !ok {
		return 0, e.Revision(), false, nil // not ours to trust: written for another stream
	}
	return next, e.Revision(), true, nil
}

// init records next for lane unless a position is recorded already, and
// returns the one that holds.
func (p *positions) init(ctx context.Context, lane string, next uint64) (uint64, error) {
	for range 3 {
		have, rev, ok, err := p.get(ctx, lane)
		if err != nil {
			return 0, err
		}
		if ok {
			return have, nil
		}
		if err := p.write(ctx, lane, next, rev); err == nil {
			return next, nil
		} else if !errors.Is(err, errConflict) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("position bucket %q: lane %s: written concurrently, try again: %w", p.cfg.Bucket, lane, driver.ErrRetryable)
}

// raise records next for lane when it is above the recorded position.
func (p *positions) raise(ctx context.Context, lane string, next uint64) error {
	for range 3 {
		have, rev, ok, err := p.get(ctx, lane)
		if err != nil {
			return err
		}
		if ok && have >= next {
			return nil
		}
		if err := p.write(ctx, lane, next, rev); !errors.Is(err, errConflict) {
			return err
		}
	}
	return nil // others are writing it: they are as current
}

// errConflict is a write that lost to another writer.
var errConflict = errors.New("written concurrently")

// write stores next for lane if the key is still at revision rev (0: the
// key must not exist); errConflict when it is not.
func (p *positions) write(ctx context.Context, lane string, next, rev uint64) error {
	err := p.put(ctx, positionKey(lane), encodePosition(next, p.created), rev)
	if err == nil || errors.Is(err, errConflict) {
		return err
	}
	return fmt.Errorf("position bucket %q: record lane %s at %d: %w", p.cfg.Bucket, lane, next, err)
}

// read returns key's value and revision; none (0) when the key does not
// exist.
func (p *positions) read(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := p.bucket().Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, classify(err)
	}
	return e.Value(), e.Revision(), nil
}

// put stores b at key if the key is still at revision rev (0: the key
// must not exist): errConflict when another writer came first.
func (p *positions) put(ctx context.Context, key string, b []byte, rev uint64) error {
	var err error
	if rev == 0 {
		_, err = p.bucket().Create(ctx, key, b)
	} else {
		_, err = p.bucket().Update(ctx, key, b, rev)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return errConflict
	}
	return classify(err)
}

// resumeSeq is where a consumer resumes: the sequence after its ack
// floor, or its own start when nothing was acknowledged yet. ok is false
// when that cannot be told (a DeliverNew consumer that acknowledged
// nothing).
func resumeSeq(info *jetstream.ConsumerInfo) (next uint64, ok bool) {
	if info.AckFloor.Consumer > 0 {
		return info.AckFloor.Stream + 1, true
	}
	switch info.Config.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
		return 1, true
	case jetstream.DeliverByStartSequencePolicy:
		return max(1, info.Config.OptStartSeq), true
	}
	return 0, false
}
