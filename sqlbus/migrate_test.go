package sqlbus_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

var update = flag.Bool("update", false, "rewrite docs/sql from Dialect.Schema")

// TestMigrate: tables of an older version are migrated with their rows
// kept; a newer version is refused with a clear error and left alone;
// opening without migrating needs the current version.
func TestMigrate(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			ctx := testCtx(t, time.Minute)
			sdb := openDB(t, db)
			p := prefix()
			dropTables(t, sdb, p)
			_, err := sqlbus.Open(ctx, sdb, db.dialect, sqlbus.Prefix(p), sqlbus.Migrate(false))
			if err == nil || !strings.Contains(err.Error(), "schema version 0, want 2") {
				t.Fatalf("Open without migrating on no tables: %v; want an error naming the versions", err)
			}
			// Version 1, as an older library left it, with a message in it.
			raw := sqlbus.Unmigrated(sdb, db.dialect, p)
			if err := sqlbus.MigrateTo(ctx, raw, 1); err != nil {
				t.Fatal(err)
			}
			if v, err := raw.Version(ctx); err != nil || v != 1 {
				t.Fatalf("Version = %d, %v; want 1", v, err)
			}
			inTx(t, raw, func(tx *sql.Tx) error {
				return sqlbus.Publish(ctx, raw, tx, "topic", &omnibus.Message{ID: "kept"})
			})
			st, err := sqlbus.Open(ctx, sdb, db.dialect, sqlbus.Prefix(p))
			if err != nil {
				t.Fatalf("Open on version 1: %v", err)
			}
			if v, err := st.Version(ctx); err != nil || v != sqlbus.SchemaVersion {
				t.Fatalf("Version after Open = %d, %v; want %d", v, err, sqlbus.SchemaVersion)
			}
			if n, err := st.Pending(ctx); err != nil || n != 1 {
				t.Fatalf("Pending after the migration = %d, %v; want the message kept", n, err)
			}
			// Again: nothing to do.
			if err := st.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
			// A newer library's tables.
			if _, err := sdb.ExecContext(ctx, db.dialect.Rebind("INSERT INTO "+p+"schema_version (version, applied_us) VALUES (?, 0)"), sqlbus.SchemaVersion+1); err != nil {
				t.Fatal(err)
			}
			for _, migrate := range []bool{true, false} {
				_, err = sqlbus.Open(ctx, sdb, db.dialect, sqlbus.Prefix(p), sqlbus.Migrate(migrate))
				if !errors.Is(err, sqlbus.ErrSchemaNewer) || !strings.Contains(err.Error(), "upgrade the library") && migrate {
					t.Fatalf("Open (migrate %v) on a newer schema: %v; want ErrSchemaNewer saying what to do", migrate, err)
				}
			}
			if n, err := st.Pending(ctx); err != nil || n != 1 {
				t.Fatalf("Pending after the refusal = %d, %v; want the tables untouched", n, err)
			}
		})
	}
}

// TestSchemaByHand: the SQL of docs/sql, applied by hand, makes tables
// the store takes without migrating; docs/sql is what Dialect.Schema
// says (go test -run SchemaByHand -update rewrites it).
func TestSchemaByHand(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			ctx := testCtx(t, time.Minute)
			doc, err := db.dialect.Schema("omnibus_")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("..", "docs", "sql", string(db.dialect)+".sql")
			if *update {
				if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := os.ReadFile(path); err != nil || string(got) != doc {
				t.Errorf("%s differs from Dialect.Schema (%v): run go test ./sqlbus -run SchemaByHand -update", path, err)
			}
			sdb := openDB(t, db)
			p := prefix()
			dropTables(t, sdb, p)
			schema, err := db.dialect.Schema(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, stmt := range strings.Split(schema, ";\n") {
				if stmt = strings.TrimSpace(stripComments(stmt)); stmt != "" {
					if _, err := sdb.ExecContext(ctx, stmt); err != nil {
						t.Fatalf("%v: %s", err, stmt)
					}
				}
			}
			st, err := sqlbus.Open(ctx, sdb, db.dialect, sqlbus.Prefix(p), sqlbus.Migrate(false))
			if err != nil {
				t.Fatalf("Open without migrating on tables made by hand: %v", err)
			}
			inTx(t, st, func(tx *sql.Tx) error {
				return sqlbus.Publish(context.Background(), st, tx, "topic", &omnibus.Message{ID: "by-hand"})
			})
		})
	}
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
