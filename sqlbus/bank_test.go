package sqlbus_test

// The bank: transfers between accounts as a saga (debit, credit, a
// settle timeout; a refund to compensate a credit the closed account
// refuses), account commands handled once through the inbox, and every
// message sent through the outbox. Instances of the bank service and
// relays run as child processes (child_test.go) that the scenario kills.

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// The bank's messages; each is keyed by its transfer.
type (
	TransferRequested struct {
		ID     string `json:"id"`
		From   int    `json:"from"`
		To     int    `json:"to"`
		Amount int    `json:"amount"`
	}
	Debit struct {
		Transfer string `json:"transfer"`
		Account  int    `json:"account"`
		Amount   int    `json:"amount"`
	}
	Credit struct {
		Transfer string `json:"transfer"`
		Account  int    `json:"account"`
		Amount   int    `json:"amount"`
		Refund   bool   `json:"refund"`
	}
	Debited         struct{ Transfer string }
	DebitRejected   struct{ Transfer string }
	Credited        struct{ Transfer string }
	CreditRejected  struct{ Transfer string }
	TransferSettled struct {
		Transfer string `json:"transfer"`
		Outcome  string `json:"outcome"` // completed, refunded, rejected
	}
	// TransferState is the transfer saga's state.
	TransferState struct {
		From, To, Amount int
		Outcome          string
		// The process that set the settle timeout, and when it fired:
		// the scenario counts the timeouts that fired after the process
		// that set them was killed.
		TimeoutSetBy int
		TimeoutFired time.Time
	}
)

func (m TransferRequested) MessageKey() string { return m.ID }
func (m Debit) MessageKey() string             { return m.Transfer }
func (m Credit) MessageKey() string            { return m.Transfer }
func (m Debited) MessageKey() string           { return m.Transfer }
func (m DebitRejected) MessageKey() string     { return m.Transfer }
func (m Credited) MessageKey() string          { return m.Transfer }
func (m CreditRejected) MessageKey() string    { return m.Transfer }
func (m TransferSettled) MessageKey() string   { return m.Transfer }

// closedAccount refuses credits (not refunds): transfers to it are
// compensated.
const closedAccount = 0

// bankTables creates the bank's tables (prefix p), dropped when t ends,
// with accounts accounts of balance each.
func bankTables(ctx context.Context, sdb *sql.DB, d sqlbus.Dialect, p string, accounts, balance int) error {
	stmts := []string{
		"CREATE TABLE " + p + "account (id INTEGER NOT NULL PRIMARY KEY, balance BIGINT NOT NULL)",
		// No unique key: the inbox alone must keep entries once per transfer.
		"CREATE TABLE " + p + "entry (transfer VARCHAR(64) NOT NULL, kind VARCHAR(16) NOT NULL, account INTEGER NOT NULL, amount BIGINT NOT NULL)",
	}
	for _, s := range stmts {
		if _, err := sdb.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	for i := range accounts {
		if _, err := sdb.ExecContext(ctx, d.Rebind("INSERT INTO "+p+"account (id, balance) VALUES (?, ?)"), i, balance); err != nil {
			return err
		}
	}
	return nil
}

// runBank runs an instance of the bank service until ctx ends: the
// account handlers and the transfer saga, sending through the outbox
// (the relays are other processes). A start that fails (a Kafka group
// rebalancing as its members die) is tried again, as a supervisor
// restarting the process would.
func runBank(ctx context.Context, st *sqlbus.SQLStore, c *omnibus.Client, cfg childConfig) error {
	for {
		b, err := bus.New(c, "bank", bus.Namespace(cfg.Namespace), bus.UseSend(sqlbus.Outbox(st)), bus.Use(sqlbus.Inbox(st)),
			bus.Subscribe(omnibus.Backoff(10*time.Millisecond, 200*time.Millisecond), omnibus.MaxAttempts(1000), omnibus.MaxInFlight(16),
				omnibus.Observe(func(e omnibus.Event) {
					if e.Err != nil && os.Getenv("SQLBUS_LOG") != "" {
						fmt.Fprintln(os.Stderr, "bank:", e.Kind, e.Err)
					}
				})))
		if err != nil {
			return err
		}
		if err := bankHandlers(b, st, cfg.Prefix+"bank_"); err != nil {
			return err
		}
		if err := b.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "bank: start (trying again):", err)
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		fmt.Fprintln(os.Stdout, "ready")
		<-ctx.Done()
		return b.Close()
	}
}

func bankHandlers(b *bus.Bus, st *sqlbus.SQLStore, p string) error {
	d := st.Dialect()
	debit := d.Rebind("UPDATE " + p + "account SET balance = balance - ? WHERE id = ? AND balance >= ?")
	credit := d.Rebind("UPDATE " + p + "account SET balance = balance + ? WHERE id = ?")
	entry := d.Rebind("INSERT INTO " + p + "entry (transfer, kind, account, amount) VALUES (?, ?, ?, ?)")
	write := func(ctx context.Context, tx *sql.Tx, update string, args []any, transfer, kind string, account, amount int) (bool, error) {
		res, err := tx.ExecContext(ctx, update, args...)
		if err != nil {
			return false, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return false, err
		}
		_, err = tx.ExecContext(ctx, entry, transfer, kind, account, amount)
		return err == nil, err
	}
	err := bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, m Debit) error {
		ok, err := write(ctx, inv.Tx(), debit, []any{m.Amount, m.Account, m.Amount}, m.Transfer, "debit", m.Account, -m.Amount)
		switch {
		case err != nil:
			return err
		case ok:
			return b.Publish(ctx, Debited{Transfer: m.Transfer})
		}
		return b.Publish(ctx, DebitRejected{Transfer: m.Transfer})
	})
	if err != nil {
		return err
	}
	err = bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, m Credit) error {
		if m.Account == closedAccount && !m.Refund {
			return b.Publish(ctx, CreditRejected{Transfer: m.Transfer})
		}
		kind := "credit"
		if m.Refund {
			kind = "refund"
		}
		if _, err := write(ctx, inv.Tx(), credit, []any{m.Amount, m.Account}, m.Transfer, kind, m.Account, m.Amount); err != nil {
			return err
		}
		if m.Refund {
			return nil
		}
		return b.Publish(ctx, Credited{Transfer: m.Transfer})
	})
	if err != nil {
		return err
	}
	return transferSaga(b, st)
}

func transferSaga(b *bus.Bus, st *sqlbus.SQLStore) error {
	sg, err := sqlbus.NewSagas(b, st)
	if err != nil {
		return err
	}
	s, err := sqlbus.NewSaga[TransferState](sg, "transfer", sqlbus.Archive(true))
	if err != nil {
		return err
	}
	type inst = sqlbus.Instance[TransferState]
	settle := func(ctx context.Context, i *inst, outcome string) error {
		i.State.Outcome = outcome
		return b.Publish(ctx, TransferSettled{Transfer: i.Key(), Outcome: outcome})
	}
	for _, err := range []error{
		sqlbus.Start(s, sqlbus.Commands(), nil, func(ctx context.Context, i *inst, m TransferRequested) error {
			if !i.New() {
				return nil // a second start message of the transfer
			}
			i.State = TransferState{From: m.From, To: m.To, Amount: m.Amount}
			return b.Send(ctx, "bank", Debit{Transfer: m.ID, Account: m.From, Amount: m.Amount})
		}),
		sqlbus.Handle(s, sqlbus.Events("bank"), nil, func(ctx context.Context, i *inst, m Debited) error {
			if err := i.AddCompensation("refund", Credit{Transfer: m.Transfer, Account: i.State.From, Amount: i.State.Amount, Refund: true}); err != nil {
				return err
			}
			return b.Send(ctx, "bank", Credit{Transfer: m.Transfer, Account: i.State.To, Amount: i.State.Amount})
		}),
		sqlbus.Handle(s, sqlbus.Events("bank"), nil, func(ctx context.Context, i *inst, m DebitRejected) error {
			i.Compensate() // nothing to undo
			return settle(ctx, i, "rejected")
		}),
		sqlbus.Handle(s, sqlbus.Events("bank"), nil, func(ctx context.Context, i *inst, m Credited) error {
			i.State.TimeoutSetBy = os.Getpid()
			return i.Timeout(ctx, "settle", 300*time.Millisecond)
		}),
		sqlbus.Handle(s, sqlbus.Events("bank"), nil, func(ctx context.Context, i *inst, m CreditRejected) error {
			i.Compensate()
			return settle(ctx, i, "refunded")
		}),
		sqlbus.Compensation(s, "refund", func(ctx context.Context, i *inst, c Credit) error {
			return b.Send(ctx, "bank", c)
		}),
	} {
		if err != nil {
			return err
		}
	}
	s.OnTimeout(func(ctx context.Context, i *inst, name string) error {
		i.State.TimeoutFired = time.Now()
		i.Complete()
		return settle(ctx, i, "completed")
	})
	return nil
}
