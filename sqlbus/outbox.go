package sqlbus

// The outbox's writing side: Publish in the caller's transaction, and the
// bus's send middleware that does it for Send, Publish and Reply under a
// context carrying a transaction.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
)

// Publish writes msgs to the outbox in tx, bound for topic: a relay
// publishes them after tx commits, in order per key, each at least once
// with the ID it has here (Publish fills empty IDs and times, as
// omnibus.Client.Publish does). A rolled back tx publishes nothing. A tx
// already committed or rolled back returns an error wrapping ErrTxDone.
func Publish(ctx context.Context, st Store, tx *sql.Tx, topic string, msgs ...*omnibus.Message) error {
	return PublishAt(ctx, st, tx, time.Time{}, topic, msgs...)
}

// PublishAt is Publish for messages published not before at (a zero at
// is now): a scheduled message, kept in the database until it is due, so
// it survives restarts.
func PublishAt(ctx context.Context, st Store, tx *sql.Tx, at time.Time, topic string, msgs ...*omnibus.Message) error {
	if tx == nil {
		return fmt.Errorf("sqlbus: publish to %q: nil transaction: %w", topic, omnibus.ErrInvalid)
	}
	if topic == "" {
		return fmt.Errorf("sqlbus: publish: empty topic: %w", omnibus.ErrInvalid)
	}
	now := time.Now()
	if at.IsZero() {
		at = now
	}
	rows := make([]OutboxRow, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("sqlbus: publish to %q: message %d is nil: %w", topic, i, omnibus.ErrInvalid)
		}
		if m.ID == "" {
			m.ID = omnibus.NewID()
		}
		if m.Time.IsZero() {
			m.Time = now
		}
		for _, f := range []struct{ name, v string }{{"ID", m.ID}, {"Key", m.Key}, {"Type", m.Type}, {"Source", m.Source}, {"ContentType", m.ContentType}} {
			if len(f.v) > 255 {
				return fmt.Errorf("sqlbus: publish to %q: message %d: %s of %d bytes, the outbox takes 255: %w", topic, i, f.name, len(f.v), omnibus.ErrInvalid)
			}
		}
		rows[i] = OutboxRow{Lane: LaneOf(m.Key, m.ID, st.Lanes()), Topic: topic, Message: *m, Created: now, Due: at}
		rows[i].Message.Topic, rows[i].Message.Lane, rows[i].Message.Position, rows[i].Message.Attempt = "", "", "", 0
	}
	return st.InsertOutbox(ctx, tx, rows)
}

// Outbox returns the bus's send middleware that writes what is sent
// under a context carrying a transaction (bus.WithTx, or a handler's ctx
// under the inbox) to the outbox of st in that transaction; other sends
// go on to the next sender. Give it last to bus.UseSend, so the
// middleware before it (tracing) runs when the message is written:
//
//	b, err := bus.New(client, "billing", bus.UseSend(sqlbus.Outbox(st)), bus.Use(sqlbus.Inbox(st)))
//
// A Request under a transaction is refused: its command would not leave
// before the commit, so it could only wait for its deadline.
func Outbox(st Store) bus.SendMiddleware {
	return func(next bus.Sender) bus.Sender {
		return func(ctx context.Context, d *bus.Dispatch) error {
			tx := bus.TxFrom(ctx)
			if tx == nil {
				return next(ctx, d)
			}
			for _, m := range d.Messages {
				if m.Headers[bus.HeaderRequestID] != "" {
					return fmt.Errorf("sqlbus: request to %q under a transaction: its command would leave at the commit, after the request waited: %w", d.To, omnibus.ErrInvalid)
				}
			}
			at, _ := ctx.Value(atKey{}).(time.Time)
			return PublishAt(ctx, st, tx, at, d.Topic, d.Messages...)
		}
	}
}

type atKey struct{}

// After returns ctx asking the outbox to publish what is sent under it
// (with the Outbox send middleware, in a transaction) no sooner than d
// from now: a scheduled command or event, kept in the database until it
// is due, so it survives restarts. Sagas' timeouts are such commands.
func After(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, atKey{}, time.Now().Add(d))
}
