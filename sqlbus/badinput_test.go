package sqlbus_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// TestBadInput: a transaction already committed or rolled back, and
// arguments the outbox cannot take, are clear errors, and nothing is
// written.
func TestBadInput(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		ctx := testCtx(t, time.Minute)
		for _, end := range []func(*sql.Tx) error{(*sql.Tx).Commit, (*sql.Tx).Rollback} {
			tx, err := st.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := end(tx); err != nil {
				t.Fatal(err)
			}
			err = sqlbus.Publish(ctx, st, tx, "t", &omnibus.Message{ID: "late"})
			if !errors.Is(err, sqlbus.ErrTxDone) || !strings.Contains(err.Error(), "already committed or rolled back") {
				t.Errorf("Publish in a finished transaction: %v; want ErrTxDone", err)
			}
		}
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		for name, call := range map[string]func() error{
			"nil transaction": func() error { return sqlbus.Publish(ctx, st, nil, "t", &omnibus.Message{}) },
			"empty topic":     func() error { return sqlbus.Publish(ctx, st, tx, "", &omnibus.Message{}) },
			"nil message":     func() error { return sqlbus.Publish(ctx, st, tx, "t", &omnibus.Message{}, nil) },
			"long key":        func() error { return sqlbus.Publish(ctx, st, tx, "t", &omnibus.Message{Key: strings.Repeat("k", 256)}) },
			"empty group":     func() error { _, err := sqlbus.Once(ctx, st, "", "id", nil); return err },
		} {
			if err := call(); !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("%s: %v; want ErrInvalid", name, err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n, err := st.Pending(ctx); err != nil || n != 0 {
			t.Errorf("Pending = %d, %v; want nothing written", n, err)
		}
		if _, err := sqlbus.Open(ctx, st.DB(), "oracle"); err == nil || !strings.Contains(err.Error(), `dialect "oracle"`) {
			t.Errorf("Open with an unknown dialect: %v", err)
		}
		if _, err := sqlbus.Open(ctx, st.DB(), st.Dialect(), sqlbus.Prefix("bad-prefix;")); err == nil || !strings.Contains(err.Error(), "table prefix") {
			t.Errorf("Open with a bad prefix: %v", err)
		}
	})
}
