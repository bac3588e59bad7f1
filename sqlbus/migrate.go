package sqlbus

// Migrations: the schema-version table, the steps from the version found
// to the library's, and the refusal of a newer schema.

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// SchemaVersion is the version of the tables this package makes and
// uses.
var SchemaVersion = len(Postgres.migrations())

// Version returns the schema version the tables are at: 0 when they do
// not exist.
func (s *SQLStore) Version(ctx context.Context) (int, error) {
	if _, err := s.db.ExecContext(ctx, s.q(s.d.versionTable())); err != nil {
		return 0, fmt.Errorf("sqlbus: create %sschema_version: %w", s.prefix, err)
	}
	var v sql.NullInt64
	if err := s.db.QueryRowContext(ctx, s.q("SELECT MAX(version) FROM {p}schema_version")).Scan(&v); err != nil {
		return 0, fmt.Errorf("sqlbus: read the schema version: %w", err)
	}
	return int(v.Int64), nil
}

// Migrate brings the tables to SchemaVersion: it creates them, or
// applies the steps from the version recorded in the schema-version
// table, each recorded when done. A schema newer than the library's is
// refused with an error wrapping ErrSchemaNewer, and nothing is changed.
// It is idempotent, and safe while other processes migrate the same
// tables (every statement is).
func (s *SQLStore) Migrate(ctx context.Context) error {
	v, err := s.Version(ctx)
	if err != nil {
		return err
	}
	steps := s.d.migrations()
	if v > len(steps) {
		return fmt.Errorf("sqlbus: tables %s* are at schema version %d, newer than this library's %d: upgrade the library (github.com/omnibus-go/omnibus/sqlbus): %w",
			s.prefix, v, len(steps), ErrSchemaNewer)
	}
	for i := v; i < len(steps); i++ {
		if err := s.migrateTo(ctx, i+1, steps[i]); err != nil {
			return err
		}
	}
	return nil
}

// migrateTo applies one step and records its version, in a transaction
// where the database has transactional DDL (PostgreSQL, SQLite).
func (s *SQLStore) migrateTo(ctx context.Context, version int, step []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlbus: migrate to version %d: %w", version, err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, stmt := range step {
		if _, err := tx.ExecContext(ctx, s.q(stmt)); err != nil {
			return fmt.Errorf("sqlbus: migrate %s* to version %d: %w (statement: %s)", s.prefix, version, err, s.q(stmt))
		}
	}
	record := s.d.insertIgnore() + " INTO {p}schema_version (version, applied_us) VALUES (?, ?)" + s.d.onConflictNothing()
	if _, err := tx.ExecContext(ctx, s.q(record), version, micros(time.Now())); err != nil {
		return fmt.Errorf("sqlbus: record schema version %d: %w", version, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlbus: migrate to version %d: %w", version, err)
	}
	s.logf("sqlbus: tables %s* migrated to schema version %s", s.prefix, strconv.Itoa(version))
	return nil
}
