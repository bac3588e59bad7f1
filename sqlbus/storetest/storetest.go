// Package storetest is the conformance suite of sqlbus.Store: every
// store (PostgreSQL, MySQL/MariaDB and SQLite in package sqlbus, or one
// of another database) runs it against a real database. Each test gets a
// fresh store (its own tables) from the harness.
package storetest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// Harness makes stores for the suite.
type Harness struct {
	// New returns a store with empty tables of its own, removed when t
	// ends.
	New func(t *testing.T) sqlbus.Store
	// SkipLocked says whether the database skips rows other transactions
	// lock (FOR UPDATE SKIP LOCKED). Without it (SQLite), a transaction
	// that locks a lane waits for the one holding the write lock.
	SkipLocked bool
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"OutboxRoundTrip", testOutboxRoundTrip},
		{"OutboxRollback", testOutboxRollback},
		{"OutboxOrder", testOutboxOrder},
		{"OutboxDue", testOutboxDue},
		{"OutboxCleanup", testOutboxCleanup},
		{"LockLane", testLockLane},
		{"TxDone", testTxDone},
		{"Inbox", testInbox},
		{"InboxConcurrent", testInboxConcurrent},
		{"InboxCleanup", testInboxCleanup},
		{"Saga", testSaga},
		{"SagaConcurrent", testSagaConcurrent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, h) })
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// inTx runs fn in a transaction and commits it.
func inTx(t *testing.T, st sqlbus.Store, fn func(tx *sql.Tx) error) {
	t.Helper()
	ctx := ctxOf(t)
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func row(st sqlbus.Store, topic, key, id string, body []byte) sqlbus.OutboxRow {
	now := time.Now()
	return sqlbus.OutboxRow{Lane: sqlbus.LaneOf(key, id, st.Lanes()), Topic: topic, Created: now, Due: now,
		Message: omnibus.Message{ID: id, Key: key, Type: "t", Source: "s", Time: now, Body: body}}
}

// drain reads every due row lane by lane, marking them sent, as a relay
// does.
func drain(t *testing.T, st sqlbus.Store) []sqlbus.OutboxRow {
	t.Helper()
	ctx := ctxOf(t)
	var out []sqlbus.OutboxRow
	for {
		lanes, err := st.PendingLanes(ctx, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(lanes) == 0 {
			return out
		}
		inTx(t, st, func(tx *sql.Tx) error {
			lane, ok, err := st.LockLane(ctx, tx, lanes)
			if err != nil || !ok {
				return fmt.Errorf("lock lane of %v: ok %v, %v", lanes, ok, err)
			}
			rows, err := st.LaneRows(ctx, tx, lane, time.Now(), 7)
			if err != nil {
				return err
			}
			ids := make([]int64, len(rows))
			for i, r := range rows {
				ids[i] = r.ID
				if r.Lane != lane {
					return fmt.Errorf("row %d of lane %d read from lane %d", r.ID, r.Lane, lane)
				}
			}
			out = append(out, rows...)
			return st.MarkSent(ctx, tx, lane, ids, time.Now())
		})
	}
}

func testOutboxRoundTrip(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	big := bytes.Repeat([]byte{0, 1, 2, 255}, 1<<18) // 1 MiB, with zero bytes
	in := []sqlbus.OutboxRow{
		row(st, "orders", "k1", "id-1", []byte(`{"a":1}`)),
		row(st, "orders", "", "id-2", nil),
		row(st, "other.topic", "k1", "id-3", big),
	}
	in[0].Message.Headers = map[string]string{"tenant": "acme", "trace-id": "x y", "ünï": "çødé"}
	in[0].Message.ContentType = "application/json"
	in[0].Message.Time = at
	inTx(t, st, func(tx *sql.Tx) error { return st.InsertOutbox(ctx, tx, in) })
	if n, err := st.Pending(ctx); err != nil || n != 3 {
		t.Fatalf("Pending = %d, %v; want 3", n, err)
	}
	out := drain(t, st)
	if len(out) != 3 {
		t.Fatalf("read %d rows, want 3", len(out))
	}
	byID := map[string]sqlbus.OutboxRow{}
	for _, r := range out {
		byID[r.Message.ID] = r
	}
	for _, w := range in {
		g, ok := byID[w.Message.ID]
		switch {
		case !ok:
			t.Errorf("message %s not read", w.Message.ID)
		case g.Topic != w.Topic || g.Message.Key != w.Message.Key || g.Message.Type != w.Message.Type ||
			g.Message.Source != w.Message.Source || g.Message.ContentType != w.Message.ContentType:
			t.Errorf("message %s: got %+v, want %+v", w.Message.ID, g, w)
		case !g.Message.Time.Equal(w.Message.Time):
			t.Errorf("message %s: time %v, want %v", w.Message.ID, g.Message.Time, w.Message.Time)
		case !bytes.Equal(g.Message.Body, w.Message.Body) || len(g.Message.Body) != len(w.Message.Body):
			t.Errorf("message %s: body of %d bytes, want %d", w.Message.ID, len(g.Message.Body), len(w.Message.Body))
		case fmt.Sprint(g.Message.Headers) != fmt.Sprint(w.Message.Headers) && len(w.Message.Headers)+len(g.Message.Headers) > 0:
			t.Errorf("message %s: headers %v, want %v", w.Message.ID, g.Message.Headers, w.Message.Headers)
		}
	}
	if n, err := st.Pending(ctx); err != nil || n != 0 {
		t.Fatalf("Pending after marking = %d, %v; want 0", n, err)
	}
}

func testOutboxRollback(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InsertOutbox(ctx, tx, []sqlbus.OutboxRow{row(st, "t", "k", "gone", nil)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, st); len(got) != 0 {
		t.Fatalf("a rolled back message was read: %v", got)
	}
}

// testOutboxOrder: rows of one key come back in insertion order, across
// transactions and batches.
func testOutboxOrder(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	const keys, per = 5, 30
	for i := range per {
		inTx(t, st, func(tx *sql.Tx) error {
			var rows []sqlbus.OutboxRow
			for k := range keys {
				rows = append(rows, row(st, "t", fmt.Sprint("key", k), fmt.Sprintf("%d-%d", k, i), nil))
			}
			return st.InsertOutbox(ctx, tx, rows)
		})
	}
	last := map[string]int{}
	for _, r := range drain(t, st) {
		var k, i int
		fmt.Sscanf(r.Message.ID, "%d-%d", &k, &i)
		if p, ok := last[r.Message.Key]; ok && i != p+1 {
			t.Fatalf("key %s: message %d after %d", r.Message.Key, i, p)
		}
		last[r.Message.Key] = i
	}
	for k := range keys {
		if last[fmt.Sprint("key", k)] != per-1 {
			t.Fatalf("key%d: last message %d, want %d", k, last[fmt.Sprint("key", k)], per-1)
		}
	}
}

func testOutboxDue(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	later := row(st, "t", "k", "later", nil)
	later.Due = time.Now().Add(time.Hour)
	inTx(t, st, func(tx *sql.Tx) error {
		return st.InsertOutbox(ctx, tx, []sqlbus.OutboxRow{later, row(st, "t", "k", "now", nil)})
	})
	got := drain(t, st)
	if len(got) != 1 || got[0].Message.ID != "now" {
		t.Fatalf("read %v; want only the message due now", got)
	}
	due, ok, err := st.NextDue(ctx, time.Now())
	if err != nil || !ok || due.Sub(later.Due).Abs() > time.Millisecond {
		t.Fatalf("NextDue = %v, %v, %v; want %v", due, ok, err, later.Due)
	}
	lanes, err := st.PendingLanes(ctx, time.Now().Add(2*time.Hour))
	if err != nil || len(lanes) != 1 || lanes[0] != later.Lane {
		t.Fatalf("PendingLanes in two hours = %v, %v; want [%d]", lanes, err, later.Lane)
	}
}

func testOutboxCleanup(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	inTx(t, st, func(tx *sql.Tx) error {
		var rows []sqlbus.OutboxRow
		for i := range 25 {
			rows = append(rows, row(st, "t", "", fmt.Sprint(i), nil))
		}
		return st.InsertOutbox(ctx, tx, rows)
	})
	drain(t, st)
	inTx(t, st, func(tx *sql.Tx) error {
		return st.InsertOutbox(ctx, tx, []sqlbus.OutboxRow{row(st, "t", "", "unsent", nil)})
	})
	if n, err := st.DeleteSent(ctx, time.Now().Add(-time.Hour), 100); err != nil || n != 0 {
		t.Fatalf("DeleteSent before an hour ago = %d, %v; want 0", n, err)
	}
	var total int64
	for {
		n, err := st.DeleteSent(ctx, time.Now().Add(time.Second), 10)
		if err != nil {
			t.Fatal(err)
		}
		if n > 10 {
			t.Fatalf("DeleteSent with limit 10 deleted %d", n)
		}
		total += n
		if n < 10 {
			break
		}
	}
	if total != 25 {
		t.Fatalf("deleted %d sent messages, want 25", total)
	}
	if n, err := st.Pending(ctx); err != nil || n != 1 {
		t.Fatalf("Pending = %d, %v; want the unsent message kept", n, err)
	}
}

// testLockLane: a lane locked by one transaction is skipped by another
// (or, without SKIP LOCKED, the other waits), so two relays never hold
// one lane.
func testLockLane(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	tx1, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback() }()
	l1, ok, err := st.LockLane(ctx, tx1, []int{3, 5})
	if err != nil || !ok || (l1 != 3 && l1 != 5) {
		t.Fatalf("LockLane = %d, %v, %v", l1, ok, err)
	}
	if !h.SkipLocked {
		got := make(chan error, 1)
		go func() {
			tx2, err := st.DB().BeginTx(ctx, nil)
			if err == nil {
				_, _, err = st.LockLane(ctx, tx2, []int{l1})
				_ = tx2.Rollback()
			}
			got <- err
		}()
		select {
		case err := <-got:
			t.Fatalf("a second LockLane returned (%v) while the first transaction holds the write lock", err)
		case <-time.After(200 * time.Millisecond):
		}
		_ = tx1.Rollback()
		if err := <-got; err != nil {
			t.Fatalf("the second LockLane after the first ended: %v", err)
		}
		return
	}
	tx2, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback() }()
	l2, ok, err := st.LockLane(ctx, tx2, []int{3, 5})
	if err != nil || !ok || l2 == l1 {
		t.Fatalf("second LockLane = %d, %v, %v; want the other lane than %d", l2, ok, err, l1)
	}
	tx3, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx3.Rollback() }()
	if l, ok, err := st.LockLane(ctx, tx3, []int{3, 5}); err != nil || ok {
		t.Fatalf("third LockLane = %d, %v, %v; want none free", l, ok, err)
	}
	_ = tx1.Rollback()
	if l, ok, err := st.LockLane(ctx, tx3, []int{3, 5}); err != nil || !ok || l != l1 {
		t.Fatalf("LockLane after the first ended = %d, %v, %v; want %d", l, ok, err, l1)
	}
}

func testTxDone(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	for _, end := range []string{"commit", "rollback"} {
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if end == "commit" {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		err = st.InsertOutbox(ctx, tx, []sqlbus.OutboxRow{row(st, "t", "k", "late", nil)})
		if !errors.Is(err, sqlbus.ErrTxDone) || !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("InsertOutbox after %s: %v; want ErrTxDone", end, err)
		}
		if _, err := st.RecordInbox(ctx, tx, "g", "id", time.Now()); !errors.Is(err, sqlbus.ErrTxDone) {
			t.Errorf("RecordInbox after %s: %v; want ErrTxDone", end, err)
		}
	}
	if n, _ := st.Pending(ctx); n != 0 {
		t.Errorf("Pending = %d after inserts into finished transactions", n)
	}
}

func testInbox(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	record := func(group, id string) (ok bool) {
		inTx(t, st, func(tx *sql.Tx) (err error) {
			ok, err = st.RecordInbox(ctx, tx, group, id, time.Now())
			return err
		})
		return ok
	}
	if !record("billing", "m1") {
		t.Fatal("first record of m1 in billing: not fresh")
	}
	if record("billing", "m1") {
		t.Fatal("second record of m1 in billing: fresh")
	}
	if !record("shipping", "m1") {
		t.Fatal("m1 in another group: not fresh")
	}
	// A rolled back record is not kept.
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := st.RecordInbox(ctx, tx, "billing", "m2", time.Now()); err != nil || !ok {
		t.Fatalf("record m2: %v, %v", ok, err)
	}
	_ = tx.Rollback()
	if !record("billing", "m2") {
		t.Fatal("m2 after a rollback: not fresh")
	}
}

// testInboxConcurrent: a second record of an ID waits for the first
// transaction and finds the ID when it commits, or records it when it
// rolls back.
func testInboxConcurrent(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	for _, commit := range []bool{true, false} {
		id := fmt.Sprint("m-", commit)
		tx1, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := st.RecordInbox(ctx, tx1, "g", id, time.Now()); err != nil || !ok {
			t.Fatalf("record: %v, %v", ok, err)
		}
		second := make(chan bool, 1)
		go func() {
			tx2, err := st.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Error(err)
				second <- false
				return
			}
			defer func() { _ = tx2.Rollback() }()
			ok, err := st.RecordInbox(ctx, tx2, "g", id, time.Now())
			if err != nil {
				t.Error(err)
			}
			second <- ok
			_ = tx2.Commit()
		}()
		select {
		case ok := <-second:
			t.Fatalf("the second record returned (%v) before the first transaction ended", ok)
		case <-time.After(200 * time.Millisecond):
		}
		if commit {
			err = tx1.Commit()
		} else {
			err = tx1.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		if ok := <-second; ok == commit {
			t.Fatalf("first transaction committed %v: the second record's fresh = %v", commit, ok)
		}
	}
}

func testInboxCleanup(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	old := time.Now().Add(-48 * time.Hour)
	inTx(t, st, func(tx *sql.Tx) error {
		for i := range 15 {
			if _, err := st.RecordInbox(ctx, tx, "g", fmt.Sprint("old", i), old); err != nil {
				return err
			}
		}
		_, err := st.RecordInbox(ctx, tx, "g", "new", time.Now())
		return err
	})
	var total int64
	for {
		n, err := st.DeleteInbox(ctx, time.Now().Add(-24*time.Hour), 4)
		if err != nil {
			t.Fatal(err)
		}
		total += n
		if n < 4 {
			break
		}
	}
	if total != 15 {
		t.Fatalf("deleted %d old records, want 15", total)
	}
	inTx(t, st, func(tx *sql.Tx) error {
		ok, err := st.RecordInbox(ctx, tx, "g", "new", time.Now())
		if err == nil && ok {
			err = errors.New("the new record was deleted")
		}
		return err
	})
}

func testSaga(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	now := time.Now()
	r := sqlbus.SagaRow{Name: "transfer", Key: "t-1", Status: sqlbus.StatusRunning, State: []byte(`{"a":1}`), Undo: []byte("[]"), Timeouts: []byte("{}"), Created: now, Updated: now}
	inTx(t, st, func(tx *sql.Tx) error {
		if _, ok, err := st.LoadSaga(ctx, tx, r.Name, r.Key); ok || err != nil {
			return fmt.Errorf("load before insert: %v, %v", ok, err)
		}
		return st.InsertSaga(ctx, tx, r)
	})
	inTx(t, st, func(tx *sql.Tx) error {
		if err := st.InsertSaga(ctx, tx, r); !errors.Is(err, sqlbus.ErrConflict) {
			return fmt.Errorf("second insert: %v, want ErrConflict", err)
		}
		g, ok, err := st.LoadSaga(ctx, tx, r.Name, r.Key)
		if err != nil || !ok || g.Version != 1 || string(g.State) != `{"a":1}` || g.Status != sqlbus.StatusRunning || string(g.Undo) != "[]" || string(g.Timeouts) != "{}" {
			return fmt.Errorf("load = %+v, %v, %v", g, ok, err)
		}
		g.Version, g.State = 2, []byte(`{"a":2}`)
		if err := st.UpdateSaga(ctx, tx, g); err != nil {
			return err
		}
		stale := g
		stale.Version = 2 // the version the saga was read at was 1: now 2
		if err := st.UpdateSaga(ctx, tx, stale); !errors.Is(err, sqlbus.ErrConflict) {
			return fmt.Errorf("update of a stale version: %v, want ErrConflict", err)
		}
		if err := st.DeleteSaga(ctx, tx, r.Name, r.Key, 1); !errors.Is(err, sqlbus.ErrConflict) {
			return fmt.Errorf("delete of a stale version: %v, want ErrConflict", err)
		}
		return nil
	})
	inTx(t, st, func(tx *sql.Tx) error {
		g, ok, err := st.LoadSaga(ctx, tx, r.Name, r.Key)
		if err != nil || !ok || g.Version != 2 || string(g.State) != `{"a":2}` {
			return fmt.Errorf("load after update = %+v, %v, %v", g, ok, err)
		}
		return st.DeleteSaga(ctx, tx, r.Name, r.Key, 2)
	})
	inTx(t, st, func(tx *sql.Tx) error {
		if _, ok, err := st.LoadSaga(ctx, tx, r.Name, r.Key); ok || err != nil {
			return fmt.Errorf("load after delete: %v, %v", ok, err)
		}
		return nil
	})
}

// testSagaConcurrent: of transactions that read a saga at one version
// and update it, one wins and the others get ErrConflict; no update is
// lost.
func testSagaConcurrent(t *testing.T, h Harness) {
	st := h.New(t)
	ctx := ctxOf(t)
	now := time.Now()
	inTx(t, st, func(tx *sql.Tx) error {
		return st.InsertSaga(ctx, tx, sqlbus.SagaRow{Name: "n", Key: "k", Status: sqlbus.StatusRunning, State: []byte("0"), Undo: []byte("[]"), Timeouts: []byte("{}"), Created: now, Updated: now})
	})
	const workers, increments = 4, 10
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for done := 0; done < increments; {
				err := func() error {
					tx, err := st.DB().BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					r, _, err := st.LoadSaga(ctx, tx, "n", "k")
					if err != nil {
						return err
					}
					var n int
					fmt.Sscan(string(r.State), &n)
					r.State, r.Version = []byte(fmt.Sprint(n+1)), r.Version+1
					if err := st.UpdateSaga(ctx, tx, r); err != nil {
						return err
					}
					return tx.Commit()
				}()
				switch {
				case err == nil:
					done++
				case errors.Is(err, sqlbus.ErrConflict) || retryable(err):
				default:
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	inTx(t, st, func(tx *sql.Tx) error {
		r, _, err := st.LoadSaga(ctx, tx, "n", "k")
		if err == nil && (string(r.State) != fmt.Sprint(workers*increments) || r.Version != workers*increments+1) {
			err = fmt.Errorf("state %s at version %d; want %d at %d", r.State, r.Version, workers*increments, workers*increments+1)
		}
		return err
	})
}

// retryable reports the errors a database returns for a transaction it
// aborts to resolve a conflict (a deadlock, a serialization failure):
// the caller runs the transaction again.
func retryable(err error) bool { return sqlbus.Retryable(err) }
