package sqlbus

// The three SQL dialects: their DDL (the migrations, by version) and the
// statements that differ between them (placeholders, insert-or-ignore,
// row locks that skip locked rows, bounded deletes).

import (
	"fmt"
	"strconv"
	"strings"
)

// Dialect is a database's SQL dialect.
type Dialect string

// The dialects SQLStore speaks.
const (
	// Postgres: PostgreSQL 12 or later, through pgx's database/sql driver
	// (github.com/jackc/pgx/v5/stdlib). Relays lock lanes with FOR
	// UPDATE SKIP LOCKED and are woken by LISTEN/NOTIFY.
	Postgres Dialect = "postgres"
	// MySQL: MySQL 8 or MariaDB 10.6 or later, through
	// github.com/go-sql-driver/mysql. Relays lock lanes with FOR UPDATE
	// SKIP LOCKED and poll.
	MySQL Dialect = "mysql"
	// SQLite: SQLite 3.35 or later, through the pure-Go modernc.org/sqlite
	// (no cgo). One writer at a time: a relay holds the write lock while
	// it publishes a batch. Open the database with _txlock=immediate and
	// a busy timeout (see the package documentation).
	SQLite Dialect = "sqlite"
)

// Dialects lists the dialects SQLStore speaks.
func Dialects() []Dialect { return []Dialect{Postgres, MySQL, SQLite} }

func (d Dialect) valid() bool { return d == Postgres || d == MySQL || d == SQLite }

// defaultLanes is the outbox's lane count, written in the lanes table
// when it is created.
const defaultLanes = 32

// migrations are the schema's versions, in order: migrations[i] takes the
// tables from version i to i+1. Each statement is idempotent (IF NOT
// EXISTS, insert-or-ignore), so a step cut short by a crash (MySQL's DDL
// commits itself) runs again cleanly. {p} is the table prefix.
func (d Dialect) migrations() [][]string {
	bytes, serial, text := "BYTEA", "BIGSERIAL PRIMARY KEY", "TEXT"
	switch d {
	case MySQL:
		bytes, serial, text = "LONGBLOB", "BIGINT AUTO_INCREMENT PRIMARY KEY", "MEDIUMTEXT"
	case SQLite:
		bytes, serial = "BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	tail := ""
	if d == MySQL {
		tail = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
	}
	// MySQL has no CREATE INDEX IF NOT EXISTS (MariaDB has): its indexes
	// are made with the table.
	index := func(name, table, cols, where string) (inTable, outside string) {
		if d == MySQL {
			return ",\n  INDEX " + name + " (" + cols + ")", ""
		}
		if d == Postgres && where != "" {
			where = " WHERE " + where
		} else {
			where = ""
		}
		return "", "CREATE INDEX IF NOT EXISTS " + name + " ON " + table + " (" + cols + ")" + where
	}
	// Relays read a lane's messages not sent in id order (pending), the
	// lanes with messages due and the next due time (due), and delete
	// sent messages by age (sent; due serves where indexes cannot be
	// partial). Each index holds what its query reads.
	pendingIn, pending := index("{p}outbox_pending", "{p}outbox", "lane, sent_us, id, due_us", "sent_us IS NULL")
	dueIn, due := index("{p}outbox_due", "{p}outbox", "sent_us, due_us, lane", "sent_us IS NULL")
	sentIn, sent := "", ""
	if d == Postgres {
		sentIn, sent = index("{p}outbox_sent", "{p}outbox", "sent_us", "sent_us IS NOT NULL")
	}
	handledIn, handled := index("{p}inbox_handled", "{p}inbox", "handled_us", "")
	lanes := make([]string, defaultLanes)
	for i := range lanes {
		lanes[i] = "(" + strconv.Itoa(i) + ", 0)"
	}
	v1 := []string{
		`CREATE TABLE IF NOT EXISTS {p}outbox (
  id ` + serial + `,
  lane INTEGER NOT NULL,
  topic VARCHAR(255) NOT NULL,
  msg_id VARCHAR(255) NOT NULL,
  msg_key VARCHAR(255) NOT NULL,
  msg_type VARCHAR(255) NOT NULL,
  source VARCHAR(255) NOT NULL,
  content_type VARCHAR(255) NOT NULL,
  msg_time BIGINT NOT NULL,
  headers ` + text + ` NOT NULL,
  body ` + bytes + ` NOT NULL,
  created_us BIGINT NOT NULL,
  due_us BIGINT NOT NULL,
  sent_us BIGINT` + pendingIn + dueIn + sentIn + `
)` + tail,
		pending, due, sent,
		`CREATE TABLE IF NOT EXISTS {p}outbox_lane (
  lane INTEGER NOT NULL PRIMARY KEY,
  served_us BIGINT NOT NULL
)` + tail,
		d.insertIgnore() + ` INTO {p}outbox_lane (lane, served_us) VALUES ` + strings.Join(lanes, ", ") + d.onConflictNothing(),
		`CREATE TABLE IF NOT EXISTS {p}inbox (
  grp VARCHAR(255) NOT NULL,
  msg_id VARCHAR(255) NOT NULL,
  handled_us BIGINT NOT NULL,
  PRIMARY KEY (grp, msg_id)` + handledIn + `
)` + tail,
		handled,
	}
	v2 := []string{
		`CREATE TABLE IF NOT EXISTS {p}saga (
  saga VARCHAR(255) NOT NULL,
  saga_key VARCHAR(255) NOT NULL,
  status VARCHAR(16) NOT NULL,
  version BIGINT NOT NULL,
  state ` + bytes + ` NOT NULL,
  compensations ` + text + ` NOT NULL,
  timeouts ` + text + ` NOT NULL,
  created_us BIGINT NOT NULL,
  updated_us BIGINT NOT NULL,
  PRIMARY KEY (saga, saga_key)
)` + tail,
	}
	return [][]string{compact(v1), compact(v2)}
}

func compact(stmts []string) []string {
	out := stmts[:0]
	for _, s := range stmts {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// versionTable is the schema-version table, made before any migration.
func (d Dialect) versionTable() string {
	tail := ""
	if d == MySQL {
		tail = " ENGINE=InnoDB"
	}
	return `CREATE TABLE IF NOT EXISTS {p}schema_version (
  version INTEGER NOT NULL PRIMARY KEY,
  applied_us BIGINT NOT NULL
)` + tail
}

func (d Dialect) insertIgnore() string {
	switch d {
	case MySQL:
		return "INSERT IGNORE"
	case SQLite:
		return "INSERT OR IGNORE"
	}
	return "INSERT"
}

func (d Dialect) onConflictNothing() string {
	if d == Postgres {
		return " ON CONFLICT DO NOTHING"
	}
	return ""
}

// skipLocked is the locking clause of a SELECT that skips rows other
// transactions hold. SQLite has one writer: the transaction's first
// write takes the lock instead (see LockLane).
func (d Dialect) skipLocked() string {
	if d == SQLite {
		return ""
	}
	return " FOR UPDATE SKIP LOCKED"
}

// bind rewrites ? placeholders as the dialect wants them and the table
// prefix: PostgreSQL numbers them ($1, $2...).
func (d Dialect) bind(prefix, q string) string {
	q = strings.ReplaceAll(q, "{p}", prefix)
	if d != Postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// placeholders returns n comma-separated ? placeholders.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// Schema returns the SQL that creates the tables of the current version
// with table prefix prefix, for a DBA to apply by hand (then SQLStore
// finds the version recorded and changes nothing).
func (d Dialect) Schema(prefix string) (string, error) {
	if !d.valid() {
		return "", fmt.Errorf("sqlbus: dialect %q: want one of %v", d, Dialects())
	}
	if err := checkPrefix(prefix); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- omnibus sqlbus schema, version %d, %s, table prefix %q.\n", len(d.migrations()), d, prefix)
	b.WriteString("-- Every statement is idempotent. Generated by sqlbus (Dialect.Schema).\n\n")
	b.WriteString(d.bind(prefix, d.versionTable()) + ";\n")
	for i, step := range d.migrations() {
		fmt.Fprintf(&b, "\n-- version %d\n", i+1)
		for _, s := range step {
			b.WriteString(d.bind(prefix, s) + ";\n")
		}
		b.WriteString(d.bind(prefix, d.insertIgnore()+" INTO {p}schema_version (version, applied_us) VALUES ("+strconv.Itoa(i+1)+", 0)"+d.onConflictNothing()) + ";\n")
	}
	return b.String(), nil
}

func checkPrefix(p string) error {
	ok := len(p) <= 40
	for i := 0; ok && i < len(p); i++ {
		c := p[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' && i > 0 || c == '_'
	}
	if !ok {
		return fmt.Errorf("sqlbus: table prefix %q: want at most 40 lowercase letters, digits and '_', not starting with a digit", p)
	}
	return nil
}

// Rebind rewrites the ? placeholders of query as the dialect wants them
// (PostgreSQL: $1, $2...), for statements written once for every
// dialect.
func (d Dialect) Rebind(query string) string { return d.bind("", query) }
