package sqlbus_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	_ "github.com/omnibus-go/omnibus/membus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// The example's messages.
type (
	Deposit struct {
		Account string
		Amount  int
	}
	Deposited struct {
		Account string
		Balance int
	}
)

func (m Deposit) MessageKey() string { return m.Account }

// A bank service on SQLite: a deposit updates the balance and publishes
// an event in one transaction; the same deposit delivered twice is
// applied once.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "sqlbus-example")
	check(err)
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bank.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	check(err)
	defer db.Close()
	_, err = db.ExecContext(ctx, "CREATE TABLE account (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
	check(err)
	_, err = db.ExecContext(ctx, "INSERT INTO account VALUES ('alice', 0)")
	check(err)

	st, err := sqlbus.Open(ctx, db, sqlbus.SQLite) // creates the outbox, inbox and saga tables
	check(err)
	client, err := omnibus.Open(ctx, "mem://example")
	check(err)
	defer client.Close()
	bank, err := bus.New(client, "bank", bus.UseSend(sqlbus.Outbox(st)), bus.Use(sqlbus.Inbox(st)))
	check(err)
	check(bus.HandleCommand(bank, func(ctx context.Context, inv bus.Invocation, d Deposit) error {
		var balance int
		err := inv.Tx().QueryRowContext(ctx, "UPDATE account SET balance = balance + ? WHERE id = ? RETURNING balance", d.Amount, d.Account).Scan(&balance)
		if err != nil {
			return err
		}
		return bank.Publish(ctx, Deposited{Account: d.Account, Balance: balance}) // in the same transaction
	}))
	deposited := make(chan Deposited, 2)
	check(bus.HandleEvent(bank, "bank", func(ctx context.Context, inv bus.Invocation, c Deposited) error {
		deposited <- c
		return nil
	}))
	check(bank.Start(ctx))
	defer bank.Close()
	relay, err := sqlbus.NewRelay(st, client)
	check(err)
	go relay.Run(ctx)

	// A teller sends a deposit in a transaction of its own (as
	// bank.Send(bus.WithTx(ctx, tx), "bank", Deposit{...}) would) and, by
	// mistake, the same message again.
	deposit := func() *omnibus.Message {
		return &omnibus.Message{ID: "deposit-1", Key: "alice", Type: "sqlbus_test.Deposit",
			ContentType: "application/json", Body: []byte(`{"Account":"alice","Amount":42}`)}
	}
	tx, err := db.BeginTx(ctx, nil)
	check(err)
	check(sqlbus.Publish(ctx, st, tx, bank.CommandTopic("bank"), deposit(), deposit()))
	check(tx.Commit())
	fmt.Println(<-deposited)
	select {
	case c := <-deposited:
		fmt.Println("twice:", c)
	case <-time.After(300 * time.Millisecond):
		fmt.Println("deposited once")
	}
	// Output:
	// {alice 42}
	// deposited once
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
