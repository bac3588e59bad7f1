package sqlbus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

type deposit struct {
	N int `json:"n"`
}

type deposited struct {
	N int `json:"n"`
}

// TestInbox: every command is delivered three times with one ID (and
// some fail once after writing); the handler's writes, made in
// inv.Tx(), and the event it publishes in the same transaction happen
// once per ID.
func TestInbox(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		const commands = 60
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		ns := st.Prefix() + "ns"
		table := st.Prefix() + "effects"
		if _, err := st.DB().ExecContext(ctx, "CREATE TABLE "+table+" (msg_id VARCHAR(100) NOT NULL, n INTEGER NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = st.DB().Exec("DROP TABLE " + table) })
		b, err := bus.New(c, "acct", bus.Namespace(ns), bus.UseSend(sqlbus.Outbox(st)), bus.Use(sqlbus.Inbox(st)),
			bus.Subscribe(omnibus.Backoff(5*time.Millisecond, 20*time.Millisecond), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(8)))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		runs, failed := map[string]int{}, map[string]bool{}
		var problems []string
		if err := bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, d deposit) error {
			tx := inv.Tx()
			if tx == nil || tx != bus.TxFrom(ctx) {
				return omnibus.Permanent(errors.New("no transaction, or not the ctx's"))
			}
			if _, err := tx.ExecContext(ctx, st.Dialect().Rebind("INSERT INTO "+table+" (msg_id, n) VALUES (?, ?)"), inv.ID(), d.N); err != nil {
				return err
			}
			if err := b.Publish(ctx, deposited(d)); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			runs[inv.ID()]++
			if d.N%5 == 0 && !failed[inv.ID()] { // fail after writing: rolled back, retried
				failed[inv.ID()] = true
				return errors.New("injected failure")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		events := &collector{}
		consume(t, c, b.EventTopic("acct"), events)
		runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))

		for i := range commands {
			m := &omnibus.Message{ID: fmt.Sprint("dep-", i), Type: "sqlbus_test.deposit", ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
			for range 3 {
				cp := *m
				if err := c.Publish(ctx, b.CommandTopic("acct"), &cp); err != nil {
					t.Fatal(err)
				}
			}
		}
		transporttest.Eventually(t, 20*time.Second, func() bool { return events.unique() == commands },
			func() string { return fmt.Sprintf("%d events of %d", events.unique(), commands) })
		rows, err := st.DB().QueryContext(ctx, "SELECT msg_id, COUNT(*) FROM "+table+" GROUP BY msg_id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		ids := 0
		for rows.Next() {
			var id string
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				t.Fatal(err)
			}
			ids++
			if n != 1 {
				problems = append(problems, fmt.Sprintf("%s written %d times", id, n))
			}
		}
		if ids != commands {
			problems = append(problems, fmt.Sprintf("%d IDs written, want %d", ids, commands))
		}
		events.mu.Lock()
		for id, n := range events.seen {
			if n != 1 {
				problems = append(problems, fmt.Sprintf("event %s published %d times", id, n))
			}
		}
		events.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		for i := range commands {
			id := fmt.Sprint("dep-", i)
			if want := 1 + btoi(i%5 == 0); runs[id] != want {
				problems = append(problems, fmt.Sprintf("%s ran %d times, want %d", id, runs[id], want))
			}
		}
		if len(problems) > 0 {
			t.Fatal(problems)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestInboxBatch: a batch handler gets the messages of a batch whose IDs
// are not recorded, in one transaction; a failure rolls the whole batch
// back, and its messages come again.
func TestInboxBatch(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		const commands = 40
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		b, err := bus.New(c, "acct", bus.Namespace(st.Prefix()+"ns"), bus.UseSend(sqlbus.Outbox(st)), bus.Use(sqlbus.Inbox(st)),
			bus.SubscribeCommands(omnibus.Batch(10, 1<<20, 20*time.Millisecond), omnibus.Backoff(5*time.Millisecond, 20*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		handled := map[string]int{} // committed handlings, by ID
		failedOnce := false
		if err := bus.HandleCommandBatch(b, func(ctx context.Context, items []bus.Item[deposit]) error {
			if items[0].Tx() == nil {
				return omnibus.Permanent(errors.New("no transaction"))
			}
			mu.Lock()
			defer mu.Unlock()
			if !failedOnce && len(items) > 1 {
				failedOnce = true
				return &omnibus.BatchError{Errs: append([]error{errors.New("injected")}, make([]error, len(items)-1)...)}
			}
			for _, it := range items {
				handled[it.ID()]++ // the commit follows: no failure can come after this
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for i := range commands {
			m := &omnibus.Message{ID: fmt.Sprint("dep-", i%(commands/2)), Key: fmt.Sprint(i % 3), Type: "sqlbus_test.deposit", ContentType: "application/json", Body: []byte(`{"n":1}`)}
			if err := c.Publish(ctx, b.CommandTopic("acct"), m); err != nil {
				t.Fatal(err)
			}
		}
		transporttest.Eventually(t, 20*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(handled) == commands/2
		}, func() string { return fmt.Sprintf("%d IDs handled of %d", len(handled), commands/2) })
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		for id, n := range handled {
			if n != 1 {
				t.Errorf("%s handled %d times, want once", id, n)
			}
		}
		if !failedOnce {
			t.Error("no batch failed: the rollback was not tested")
		}
	})
}
