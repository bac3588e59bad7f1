package bus

// Transactions: a context may carry the database transaction that a
// handler runs in, or that a send joins. The bus itself keeps no
// database: middleware (package sqlbus's inbox and outbox) puts the
// transaction there and takes it out.

import (
	"context"
	"database/sql"
	"errors"
)

// ErrNoOutbox: a send under a context carrying a transaction ([WithTx])
// reached the bus's own publish, so no send middleware wrote it to an
// outbox in that transaction. Publishing it now would break the
// promise of the transaction (it could be published and then rolled
// back), so the send fails. Install the outbox's send middleware (package
// sqlbus: bus.UseSend(sqlbus.Outbox(store)), given last).
var ErrNoOutbox = errors.New("send under a transaction without an outbox")

type txKey struct{}

// WithTx returns ctx carrying tx. Sends under it (Send, Publish, Reply)
// are written to the outbox in tx by the outbox's send middleware and
// published after tx commits; handlers run by the inbox's middleware
// get their ctx this way, and [Invocation.Tx] returns it.
func WithTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns the transaction ctx carries, or nil.
func TxFrom(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

// Tx is the database transaction the handler runs in when middleware
// runs it in one (package sqlbus's inbox: the message's ID is recorded
// in it, so its writes happen once per message and group), or nil. The
// handler's ctx carries it too, so what the handler sends under ctx goes
// through the outbox in the same transaction.
func (inv Invocation) Tx() *sql.Tx { return inv.tx }
