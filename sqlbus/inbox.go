package sqlbus

// The inbox: a handler's transaction records the message's ID per
// consumer group, so its effects happen once per message and group; a
// redelivery of a recorded ID is settled without running the handler.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
)

// Once runs fn in a transaction of st's database in which it records
// that group handled message id, and commits when fn returns nil. When
// the ID was recorded before, fn does not run and Once returns false and
// nil. An error of fn (or of the commit) rolls everything back, the
// record included, and is returned: the message's next delivery runs fn
// again. Two deliveries of one ID at once (a redelivery while the first
// still runs) are serialized by the record: the second waits for the
// first's commit and then finds the ID.
func Once(ctx context.Context, st Store, group, id string, fn func(ctx context.Context, tx *sql.Tx) error) (ran bool, err error) {
	if group == "" || id == "" {
		return false, fmt.Errorf("sqlbus: inbox: empty group or message ID: %w", omnibus.ErrInvalid)
	}
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("sqlbus: inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	fresh, err := st.RecordInbox(ctx, tx, group, id, time.Now())
	if err != nil || !fresh {
		return false, err
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("sqlbus: inbox: commit %q of %q: %w", id, group, err)
	}
	return true, nil
}

// Inbox returns the bus's handler middleware that runs each handler in a
// transaction of st's database, through Once with the service's name as
// the group: Invocation.Tx (and bus.TxFrom of the handler's ctx) is the
// transaction, what the handler sends under its ctx goes to the outbox in
// it (with the Outbox send middleware), and a message whose ID the
// service recorded is settled without running the handler. A batch
// handler gets the messages not recorded yet, in one transaction.
func Inbox(st Store) bus.Middleware {
	return func(next bus.Handler) bus.Handler {
		return func(ctx context.Context, c *bus.Call) error {
			if len(c.Messages) == 1 {
				_, err := Once(ctx, st, c.Service, c.Messages[0].ID, func(ctx context.Context, tx *sql.Tx) error {
					return next(bus.WithTx(ctx, tx), c)
				})
				return err
			}
			return inboxBatch(ctx, st, c, next)
		}
	}
}

// inboxBatch records every message of a batch call in one transaction
// and calls next with those not recorded before.
func inboxBatch(ctx context.Context, st Store, c *bus.Call, next bus.Handler) error {
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlbus: inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	fresh := &bus.Call{Service: c.Service, Kind: c.Kind, Type: c.Type}
	var index []int // fresh.Messages[k] is c.Messages[index[k]]
	now := time.Now()
	for i, m := range c.Messages {
		ok, err := st.RecordInbox(ctx, tx, c.Service, m.ID, now)
		if err != nil {
			return err
		}
		if ok {
			fresh.Messages, fresh.Values = append(fresh.Messages, m), append(fresh.Values, c.Values[i])
			index = append(index, i)
		}
	}
	if len(index) == 0 {
		return nil
	}
	if err := next(bus.WithTx(ctx, tx), fresh); err != nil {
		// One transaction: any failure rolls back the batch, so every
		// message's outcome is the failure.
		return firstFailure(err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlbus: inbox: commit a batch of %d: %w", len(index), err)
	}
	return nil
}

// firstFailure turns a batch handler's error into the outcome of a
// batch whose transaction was rolled back: every message failed. A
// per-message BatchError loses its meaning (nothing committed), so the
// first failure stands for all.
func firstFailure(err error) error {
	if be, ok := err.(*omnibus.BatchError); ok {
		for _, e := range be.Errs {
			if e != nil {
				return e
			}
		}
	}
	return err
}
