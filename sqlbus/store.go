package sqlbus

// The store SPI: the tables' primitives, each inside a transaction its
// caller owns, which the outbox, the relay, the inbox and the sagas are
// written on once. SQLStore implements it for PostgreSQL, MySQL/MariaDB
// and SQLite; package storetest is its conformance suite.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Store is what the outbox, the relay, the inbox and the sagas need of a
// database. Every method taking a *sql.Tx works inside it and neither
// commits nor rolls it back. Times are the caller's clock. Methods may be
// called from any goroutine. [SQLStore] implements it; a store of
// another database passes package storetest's suite.
type Store interface {
	// DB is the database the store's tables are in.
	DB() *sql.DB
	// Dialect names the database's SQL dialect.
	Dialect() Dialect
	// Lanes is the number of outbox lanes: a message's lane is its key's
	// hash modulo Lanes (LaneOf), fixed when the tables are created.
	Lanes() int

	// InsertOutbox adds messages to the outbox in tx, pending from
	// their Due time on; they become visible to relays when tx commits.
	InsertOutbox(ctx context.Context, tx *sql.Tx, rows []OutboxRow) error
	// PendingLanes lists the lanes holding messages due at now and not
	// yet sent, outside any transaction (a hint: another relay may take
	// them first).
	PendingLanes(ctx context.Context, now time.Time) ([]int, error)
	// LockLane locks the first of lanes that no other transaction holds
	// for tx; ok is false when every one is held. A lane stays locked until tx ends, so one transaction
	// at a time publishes a lane's messages: that keeps their order.
	LockLane(ctx context.Context, tx *sql.Tx, lanes []int) (lane int, ok bool, err error)
	// LaneRows returns up to limit messages of lane due at now and not
	// sent, in the order they were inserted.
	LaneRows(ctx context.Context, tx *sql.Tx, lane int, now time.Time, limit int) ([]OutboxRow, error)
	// MarkSent marks the messages of ids (of lane) sent at now.
	MarkSent(ctx context.Context, tx *sql.Tx, lane int, ids []int64, now time.Time) error
	// NextDue returns the earliest due time after now of a message not
	// sent; ok is false when there is none.
	NextDue(ctx context.Context, now time.Time) (due time.Time, ok bool, err error)
	// DeleteSent deletes up to limit messages sent before before and
	// returns how many it deleted.
	DeleteSent(ctx context.Context, before time.Time, limit int) (int64, error)
	// Pending counts the messages not sent yet, due or not.
	Pending(ctx context.Context) (int64, error)

	// RecordInbox records in tx that group handled message id at now;
	// it returns false, recording nothing, when the ID was recorded
	// before (by a committed transaction, or by one that commits while
	// this call waits for it).
	RecordInbox(ctx context.Context, tx *sql.Tx, group, id string, now time.Time) (bool, error)
	// DeleteInbox deletes up to limit records made before before.
	DeleteInbox(ctx context.Context, before time.Time, limit int) (int64, error)

	// LoadSaga reads the saga of name and key; ok is false when there is
	// none.
	LoadSaga(ctx context.Context, tx *sql.Tx, name, key string) (row SagaRow, ok bool, err error)
	// InsertSaga adds a saga at version 1; one of the same name and key
	// returns an error wrapping ErrConflict.
	InsertSaga(ctx context.Context, tx *sql.Tx, row SagaRow) error
	// UpdateSaga writes row over the saga at row.Version-1 and sets
	// row.Version; a saga at another version (or none) returns an error
	// wrapping ErrConflict.
	UpdateSaga(ctx context.Context, tx *sql.Tx, row SagaRow) error
	// DeleteSaga deletes the saga at version; a saga at another version
	// (or none) returns an error wrapping ErrConflict.
	DeleteSaga(ctx context.Context, tx *sql.Tx, name, key string, version int64) error
}

// Notifier is implemented by stores that can wake relays when messages
// are committed (PostgreSQL: LISTEN/NOTIFY), so relays need not poll.
type Notifier interface {
	// Notifies reports whether the store can notify (an SQLStore of
	// PostgreSQL); Listen of one that cannot fails at once.
	Notifies() bool
	// Listen calls wake after each commit of outbox messages, and once
	// whenever it (re)connects, until ctx ends; then it returns ctx's
	// error. wake must not block.
	Listen(ctx context.Context, wake func()) error
}

// OutboxRow is a message in the outbox.
type OutboxRow struct {
	ID      int64 // set by the store, increasing in insertion order
	Lane    int
	Topic   string
	Message omnibus.Message // ID, Key, Type, Source, Time, ContentType, Headers, Body
	Created time.Time
	Due     time.Time // not published before
}

// SagaRow is a saga as stored.
type SagaRow struct {
	Name     string
	Key      string
	Status   string // StatusRunning, StatusCompleted, StatusCompensated
	Version  int64
	State    []byte // the encoded state
	Undo     []byte // the compensation steps, encoded
	Timeouts []byte // the timeouts awaited, encoded
	Created  time.Time
	Updated  time.Time
}

// Saga statuses.
const (
	StatusRunning     = "running"
	StatusCompleted   = "completed"
	StatusCompensated = "compensated"
)

// Sentinel errors; errors.Is finds them in what the package returns.
var (
	// ErrConflict: a saga changed (or was created) since it was read;
	// the message that ran into it is retried.
	ErrConflict = errors.New("concurrent update")
	// ErrTxDone: the transaction given was already committed or rolled
	// back. It wraps sql.ErrTxDone.
	ErrTxDone = fmt.Errorf("the transaction is already committed or rolled back: %w", sql.ErrTxDone)
	// ErrSchemaNewer: the tables were made by a newer version of this
	// package; it refuses to use them.
	ErrSchemaNewer = errors.New("schema newer than this library")
	// ErrSagaState: a saga's stored state does not decode; the message
	// is dead-lettered and the state left as it is.
	ErrSagaState = errors.New("saga state does not decode")
)

// txErr turns database/sql's "transaction done" into ErrTxDone.
func txErr(op string, err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("sqlbus: %s: %w", op, ErrTxDone)
	}
	return fmt.Errorf("sqlbus: %s: %w", op, err)
}

// Retryable reports whether err is the database aborting a transaction
// to resolve a conflict with another (a deadlock, a serialization
// failure, a lock wait that timed out, SQLite busy), so that running the
// transaction again may succeed; a saga's ErrConflict too.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrConflict) {
		return true
	}
	var pg interface{ SQLState() string } // pgx's *pgconn.PgError
	if errors.As(err, &pg) {
		s := pg.SQLState()
		return s == "40001" || s == "40P01" || s == "55P03"
	}
	var lite interface{ Code() int } // modernc.org/sqlite's *Error
	if errors.As(err, &lite) {
		c := lite.Code() & 0xff // the primary code
		return c == 5 || c == 6 // SQLITE_BUSY, SQLITE_LOCKED
	}
	// go-sql-driver/mysql's *MySQLError: "Error 1213 (40001): Deadlock found..."
	s := err.Error()
	return strings.Contains(s, "Error 1213 ") || strings.Contains(s, "Error 1205 ")
}
