package sqlbus

// SQLStore: the Store of PostgreSQL, MySQL/MariaDB and SQLite over
// database/sql, one implementation with the dialect's statements.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"
)

// SQLStore keeps the outbox, the inbox and the sagas in tables of a
// PostgreSQL, MySQL/MariaDB or SQLite database (see [Dialect]). Create
// it with [Open]. It may be used from any goroutine.
type SQLStore struct {
	db     *sql.DB
	d      Dialect
	prefix string
	log    *slog.Logger
}

var _ Store = (*SQLStore)(nil)

// StoreOption configures an SQLStore.
type StoreOption func(*storeConfig) error

type storeConfig struct {
	prefix  string
	migrate bool
	log     *slog.Logger
}

// Prefix starts the name of every table the store uses, so several
// applications (or tests) share a database: "<prefix>outbox",
// "<prefix>inbox", "<prefix>saga"... Lowercase letters, digits and '_'.
// Default: "omnibus_". PostgreSQL: a schema-qualified name is not taken;
// set the connection's search_path instead.
func Prefix(p string) StoreOption {
	return func(c *storeConfig) error {
		if err := checkPrefix(p); err != nil {
			return err
		}
		c.prefix = p
		return nil
	}
}

// Migrate says whether Open creates or migrates the tables. Without it
// (false) the tables must be at SchemaVersion already (applied by hand
// from Dialect.Schema or docs/sql), else Open fails. Default: true.
func Migrate(on bool) StoreOption {
	return func(c *storeConfig) error {
		c.migrate = on
		return nil
	}
}

// Logger sets where the store logs migrations. Default: slog.Default().
func Logger(l *slog.Logger) StoreOption {
	return func(c *storeConfig) error {
		if l == nil {
			return errors.New("sqlbus: nil logger")
		}
		c.log = l
		return nil
	}
}

// Open returns the store of db, a database of dialect d, after creating
// or migrating its tables (see [SQLStore.Migrate]). The store does not
// own db: close it after the store's users.
func Open(ctx context.Context, db *sql.DB, d Dialect, opts ...StoreOption) (*SQLStore, error) {
	if db == nil {
		return nil, errors.New("sqlbus: Open: nil database")
	}
	if !d.valid() {
		return nil, fmt.Errorf("sqlbus: Open: dialect %q: want one of %v", d, Dialects())
	}
	cfg := storeConfig{prefix: "omnibus_", migrate: true, log: slog.Default()}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	s := &SQLStore{db: db, d: d, prefix: cfg.prefix, log: cfg.log}
	if cfg.migrate {
		return s, s.Migrate(ctx)
	}
	v, err := s.Version(ctx)
	switch {
	case err != nil:
		return nil, err
	case v > SchemaVersion:
		return nil, fmt.Errorf("sqlbus: tables %s* are at schema version %d, newer than this library's %d: %w", s.prefix, v, SchemaVersion, ErrSchemaNewer)
	case v < SchemaVersion:
		return nil, fmt.Errorf("sqlbus: tables %s* are at schema version %d, want %d: apply the migrations (Dialect.Schema, docs/sql) or open with Migrate(true)", s.prefix, v, SchemaVersion)
	}
	return s, nil
}

// DB is the store's database.
func (s *SQLStore) DB() *sql.DB { return s.db }

// Dialect is the store's dialect.
func (s *SQLStore) Dialect() Dialect { return s.d }

// Prefix is the prefix of the store's tables.
func (s *SQLStore) Prefix() string { return s.prefix }

// Lanes is the outbox's lane count.
func (s *SQLStore) Lanes() int { return defaultLanes }

// Tables lists the store's tables, the schema-version table last.
func (s *SQLStore) Tables() []string {
	return []string{s.prefix + "outbox", s.prefix + "outbox_lane", s.prefix + "inbox", s.prefix + "saga", s.prefix + "schema_version"}
}

func (s *SQLStore) q(query string) string { return s.d.bind(s.prefix, query) }

func (s *SQLStore) logf(format string, args ...any) { s.log.Info(fmt.Sprintf(format, args...)) }

// LaneOf is the lane of a message of key (of ID id when the key is
// empty: such messages have no order to keep) among n lanes.
func LaneOf(key, id string, n int) int {
	if key == "" {
		key = id
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// InsertOutbox implements Store. On PostgreSQL it also notifies the
// relays' channel, which they hear when tx commits.
func (s *SQLStore) InsertOutbox(ctx context.Context, tx *sql.Tx, rows []OutboxRow) error {
	if len(rows) == 0 {
		return nil
	}
	const cols = 12
	const per = 100 // rows per statement
	for len(rows) > 0 {
		n := min(len(rows), per)
		args := make([]any, 0, n*cols)
		values := make([]string, n)
		for i, r := range rows[:n] {
			m := &r.Message
			headers := []byte("{}")
			if len(m.Headers) > 0 {
				headers, _ = json.Marshal(m.Headers)
			}
			body := m.Body
			if body == nil {
				body = []byte{}
			}
			values[i] = "(" + placeholders(cols) + ")"
			args = append(args, r.Lane, r.Topic, m.ID, m.Key, m.Type, m.Source, m.ContentType, m.Time.UnixNano(),
				string(headers), body, micros(r.Created), micros(r.Due))
		}
		q := "INSERT INTO {p}outbox (lane, topic, msg_id, msg_key, msg_type, source, content_type, msg_time, headers, body, created_us, due_us) VALUES " +
			strings.Join(values, ", ")
		if _, err := tx.ExecContext(ctx, s.q(q), args...); err != nil {
			return txErr("insert into "+s.prefix+"outbox", err)
		}
		rows = rows[n:]
	}
	if s.d == Postgres {
		// PostgreSQL serializes the commits of notifying transactions
		// (a database-wide lock held through the commit's WAL flush), so
		// a notification per commit caps the database at one commit per
		// flush. A relay that published recently polls (see Relay), so
		// only a relay that is idle needs waking.
		q := s.q("SELECT pg_notify(?, '') WHERE NOT EXISTS (SELECT 1 FROM {p}outbox_lane WHERE served_us > ?)")
		if _, err := tx.ExecContext(ctx, q, s.channel(), micros(time.Now().Add(-quietAfter))); err != nil {
			return txErr("notify "+s.channel(), err)
		}
	}
	return nil
}

// A relay polls every hotPoll until hotFor has passed since it last
// published; publishers notify only when no lane was served for
// quietAfter (less than hotFor, for the clocks of two hosts and the time
// a relay takes to mark a lane).
const (
	hotPoll    = 10 * time.Millisecond
	hotFor     = time.Second
	quietAfter = 500 * time.Millisecond
)

// PendingLanes implements Store.
func (s *SQLStore) PendingLanes(ctx context.Context, now time.Time) ([]int, error) {
	rows, err := s.db.QueryContext(ctx, s.q("SELECT DISTINCT lane FROM {p}outbox WHERE sent_us IS NULL AND due_us <= ?"), micros(now))
	if err != nil {
		return nil, fmt.Errorf("sqlbus: pending lanes: %w", err)
	}
	defer rows.Close()
	var lanes []int
	for rows.Next() {
		var l int
		if err := rows.Scan(&l); err != nil {
			return nil, fmt.Errorf("sqlbus: pending lanes: %w", err)
		}
		lanes = append(lanes, l)
	}
	return lanes, rows.Err()
}

// LockLane implements Store. PostgreSQL and MySQL lock the lane's row
// with FOR UPDATE SKIP LOCKED, one lane at a time (MySQL would lock every
// row a sorted scan reads); SQLite's transaction takes the database's
// write lock with its first write, which the others wait for.
func (s *SQLStore) LockLane(ctx context.Context, tx *sql.Tx, lanes []int) (int, bool, error) {
	if len(lanes) == 0 {
		return 0, false, nil
	}
	if s.d == SQLite {
		if _, err := tx.ExecContext(ctx, s.q("UPDATE {p}outbox_lane SET served_us = served_us WHERE lane = ?"), lanes[0]); err != nil {
			return 0, false, txErr("lock lane", err)
		}
		return lanes[0], true, nil
	}
	q := s.q("SELECT lane FROM {p}outbox_lane WHERE lane = ?" + s.d.skipLocked())
	for _, l := range lanes {
		var lane int
		err := tx.QueryRowContext(ctx, q, l).Scan(&lane)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, false, txErr("lock lane", err)
		}
		return lane, true, nil
	}
	return 0, false, nil
}

// LaneRows implements Store.
func (s *SQLStore) LaneRows(ctx context.Context, tx *sql.Tx, lane int, now time.Time, limit int) ([]OutboxRow, error) {
	rows, err := tx.QueryContext(ctx, s.q(`SELECT id, topic, msg_id, msg_key, msg_type, source, content_type, msg_time, headers, body, created_us, due_us
FROM {p}outbox WHERE lane = ? AND sent_us IS NULL AND due_us <= ? ORDER BY id LIMIT ?`), lane, micros(now), limit)
	if err != nil {
		return nil, txErr("read lane", err)
	}
	defer rows.Close()
	var out []OutboxRow
	for rows.Next() {
		r := OutboxRow{Lane: lane}
		m := &r.Message
		var t, created, due int64
		var headers string
		if err := rows.Scan(&r.ID, &r.Topic, &m.ID, &m.Key, &m.Type, &m.Source, &m.ContentType, &t, &headers, &m.Body, &created, &due); err != nil {
			return nil, fmt.Errorf("sqlbus: read lane %d: %w", lane, err)
		}
		if headers != "{}" {
			if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
				return nil, fmt.Errorf("sqlbus: outbox row %d: headers: %w", r.ID, err)
			}
		}
		m.Time, r.Created, r.Due = time.Unix(0, t), fromMicros(created), fromMicros(due)
		out = append(out, r)
	}
	return out, rows.Err()
}

// MarkSent implements Store.
func (s *SQLStore) MarkSent(ctx context.Context, tx *sql.Tx, lane int, ids []int64, now time.Time) error {
	for len(ids) > 0 {
		n := min(len(ids), 500)
		args := []any{micros(now)}
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		if _, err := tx.ExecContext(ctx, s.q("UPDATE {p}outbox SET sent_us = ? WHERE id IN ("+placeholders(n)+")"), args...); err != nil {
			return txErr("mark sent", err)
		}
		ids = ids[n:]
	}
	if _, err := tx.ExecContext(ctx, s.q("UPDATE {p}outbox_lane SET served_us = ? WHERE lane = ?"), micros(now), lane); err != nil {
		return txErr("mark lane served", err)
	}
	return nil
}

// NextDue implements Store.
func (s *SQLStore) NextDue(ctx context.Context, now time.Time) (time.Time, bool, error) {
	var due sql.NullInt64
	err := s.db.QueryRowContext(ctx, s.q("SELECT MIN(due_us) FROM {p}outbox WHERE sent_us IS NULL AND due_us > ?"), micros(now)).Scan(&due)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("sqlbus: next due: %w", err)
	}
	return fromMicros(due.Int64), due.Valid, nil
}

// DeleteSent implements Store.
func (s *SQLStore) DeleteSent(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.deleteBounded(ctx, "outbox", "sent_us IS NOT NULL AND sent_us < ?", "id", before, limit)
}

// DeleteInbox implements Store.
func (s *SQLStore) DeleteInbox(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.deleteBounded(ctx, "inbox", "handled_us < ?", "", before, limit)
}

// deleteBounded deletes up to limit rows of table matching where (one ?
// for before). MySQL bounds a DELETE itself; the others through a
// subquery on key (or the row's identity).
func (s *SQLStore) deleteBounded(ctx context.Context, table, where, key string, before time.Time, limit int) (int64, error) {
	var q string
	switch {
	case s.d == MySQL:
		q = "DELETE FROM {p}" + table + " WHERE " + where + " LIMIT ?"
	case s.d == SQLite || key == "":
		rowid := "rowid"
		if s.d == Postgres {
			rowid = "ctid"
		}
		if key != "" {
			rowid = key
		}
		q = "DELETE FROM {p}" + table + " WHERE " + rowid + " IN (SELECT " + rowid + " FROM {p}" + table + " WHERE " + where + " LIMIT ?)"
	default:
		q = "DELETE FROM {p}" + table + " WHERE " + key + " IN (SELECT " + key + " FROM {p}" + table + " WHERE " + where + " LIMIT ?)"
	}
	res, err := s.db.ExecContext(ctx, s.q(q), micros(before), limit)
	if err != nil {
		return 0, fmt.Errorf("sqlbus: clean %s%s: %w", s.prefix, table, err)
	}
	return res.RowsAffected()
}

// Pending implements Store.
func (s *SQLStore) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM {p}outbox WHERE sent_us IS NULL")).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlbus: count pending: %w", err)
	}
	return n, nil
}

// RecordInbox implements Store.
func (s *SQLStore) RecordInbox(ctx context.Context, tx *sql.Tx, group, id string, now time.Time) (bool, error) {
	q := s.d.insertIgnore() + " INTO {p}inbox (grp, msg_id, handled_us) VALUES (?, ?, ?)" + s.d.onConflictNothing()
	res, err := tx.ExecContext(ctx, s.q(q), group, id, micros(now))
	if err != nil {
		return false, txErr("record in "+s.prefix+"inbox", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlbus: record in %sinbox: %w", s.prefix, err)
	}
	return n == 1, nil
}

// LoadSaga implements Store.
func (s *SQLStore) LoadSaga(ctx context.Context, tx *sql.Tx, name, key string) (SagaRow, bool, error) {
	r := SagaRow{Name: name, Key: key}
	var undo, timeouts string
	var created, updated int64
	err := tx.QueryRowContext(ctx, s.q("SELECT status, version, state, compensations, timeouts, created_us, updated_us FROM {p}saga WHERE saga = ? AND saga_key = ?"), name, key).
		Scan(&r.Status, &r.Version, &r.State, &undo, &timeouts, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, txErr(fmt.Sprintf("load saga %s %q", name, key), err)
	}
	r.Undo, r.Timeouts, r.Created, r.Updated = []byte(undo), []byte(timeouts), fromMicros(created), fromMicros(updated)
	return r, true, nil
}

// InsertSaga implements Store.
func (s *SQLStore) InsertSaga(ctx context.Context, tx *sql.Tx, r SagaRow) error {
	q := s.d.insertIgnore() + " INTO {p}saga (saga, saga_key, status, version, state, compensations, timeouts, created_us, updated_us) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)" + s.d.onConflictNothing()
	res, err := tx.ExecContext(ctx, s.q(q), r.Name, r.Key, r.Status, nonNil(r.State), string(r.Undo), string(r.Timeouts), micros(r.Created), micros(r.Updated))
	return s.changed(res, err, "insert", r.Name, r.Key)
}

// UpdateSaga implements Store.
func (s *SQLStore) UpdateSaga(ctx context.Context, tx *sql.Tx, r SagaRow) error {
	res, err := tx.ExecContext(ctx, s.q("UPDATE {p}saga SET status = ?, version = ?, state = ?, compensations = ?, timeouts = ?, updated_us = ? WHERE saga = ? AND saga_key = ? AND version = ?"),
		r.Status, r.Version, nonNil(r.State), string(r.Undo), string(r.Timeouts), micros(r.Updated), r.Name, r.Key, r.Version-1)
	return s.changed(res, err, "update", r.Name, r.Key)
}

// DeleteSaga implements Store.
func (s *SQLStore) DeleteSaga(ctx context.Context, tx *sql.Tx, name, key string, version int64) error {
	res, err := tx.ExecContext(ctx, s.q("DELETE FROM {p}saga WHERE saga = ? AND saga_key = ? AND version = ?"), name, key, version)
	return s.changed(res, err, "delete", name, key)
}

// changed checks that a saga statement changed one row: none is a
// conflict.
func (s *SQLStore) changed(res sql.Result, err error, op, name, key string) error {
	if err != nil {
		return txErr(fmt.Sprintf("%s saga %s %q", op, name, key), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlbus: %s saga %s %q: %w", op, name, key, err)
	}
	if n != 1 {
		return fmt.Errorf("sqlbus: %s saga %s %q: %w", op, name, key, ErrConflict)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
