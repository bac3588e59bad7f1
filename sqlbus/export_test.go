package sqlbus

import (
	"context"
	"database/sql"
	"log/slog"
)

// MigrateTo applies the migrations up to version v only: the tables an
// older library made.
func MigrateTo(ctx context.Context, s *SQLStore, v int) error {
	if _, err := s.Version(ctx); err != nil {
		return err
	}
	for i, step := range s.d.migrations()[:v] {
		if err := s.migrateTo(ctx, i+1, step); err != nil {
			return err
		}
	}
	return nil
}

// Unmigrated returns the store of prefix p on db without touching its
// tables.
func Unmigrated(db *sql.DB, d Dialect, p string) *SQLStore {
	return &SQLStore{db: db, d: d, prefix: p, log: slog.Default()}
}
