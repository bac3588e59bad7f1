// Package sqlbus keeps the messages of a service that writes to a SQL
// database as safe as its writes: a transactional outbox (messages are
// written in the caller's transaction and published by a relay after
// the commit), an idempotent inbox (a handler's writes happen once per
// message ID and consumer group) and sagas (typed state changed by
// messages under optimistic concurrency, with timeouts and
// compensation), on PostgreSQL (pgx), MySQL/MariaDB and SQLite (pure Go,
// the zero-setup default for development and the examples). It works
// with package bus, and the outbox and the inbox with plain omnibus
// clients too.
//
//	db, err := sql.Open("pgx", "postgres://app@db/app")       // github.com/jackc/pgx/v5/stdlib
//	st, err := sqlbus.Open(ctx, db, sqlbus.Postgres)           // creates or migrates the tables
//	b, err := bus.New(client, "billing",
//		bus.UseSend(sqlbus.Outbox(st)), // sends under a transaction go to the outbox
//		bus.Use(sqlbus.Inbox(st)))      // handlers run in a transaction, once per message ID
//	err = bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, c Charge) error {
//		_, err := inv.Tx().ExecContext(ctx, "UPDATE account SET balance = balance - $1 WHERE id = $2", c.Amount, c.Account)
//		if err != nil {
//			return err
//		}
//		return b.Publish(ctx, Charged{Order: c.Order}) // in inv.Tx(): published after the commit
//	})
//	relay, err := sqlbus.NewRelay(st, client)
//	go relay.Run(ctx)
//
//	// anywhere, in a transaction of your own
//	err = b.Send(bus.WithTx(ctx, tx), "billing", Charge{...})     // or sqlbus.Publish(ctx, st, tx, topic, msgs...)
//
// # Databases
//
// [Open] takes a *sql.DB and its [Dialect]; the driver is yours to
// import:
//
//	dialect   driver (database/sql name)                  tested on        relays share lanes with   woken by
//	Postgres  github.com/jackc/pgx/v5/stdlib ("pgx")      PostgreSQL 15    FOR UPDATE SKIP LOCKED    LISTEN/NOTIFY
//	MySQL     github.com/go-sql-driver/mysql ("mysql")    MariaDB 10.11    FOR UPDATE SKIP LOCKED    polling
//	SQLite    modernc.org/sqlite ("sqlite")               SQLite 3.54      the one write lock        polling
//
// pgx users with a pool get a *sql.DB on it with stdlib.OpenDBFromPool.
// SQLite is one writer at a time: open it in WAL mode with a busy timeout
// and transactions that take the write lock when they begin, so that two
// writers wait for each other instead of failing:
//
//	file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate
//
// # Tables and migrations
//
// The tables are named with a prefix ([Prefix], default "omnibus_"):
// outbox and outbox_lane (the messages to publish, and the lanes relays
// lock), inbox (message IDs handled, per group), saga (sagas' states)
// and schema_version (the versions applied). Open creates them, or
// migrates tables an older version made, one recorded version at a
// time; every statement is idempotent, so processes starting together
// are safe. Tables of a newer version are refused ([ErrSchemaNewer]) and
// left as they are. A DBA who applies schemas by hand takes the SQL of
// [Dialect.Schema] (docs/sql in the repository has it for the default
// prefix) and opens with Migrate(false).
//
// # Delivery semantics
//
// Outbox: a message written in a transaction is published if and only
// if the transaction commits, at least once, with the ID it was given,
// in the order of its writes among the messages of its key. Several
// relays (processes) may run: each takes a lane at a time (a message's
// lane is its key's hash, among 32), locked in the database for the
// transaction that publishes the lane's next batch and marks it sent,
// so in the normal case every message is published once and a key's
// messages in order. A relay that dies between publishing a batch and
// committing its mark leaves the batch to the next relay, which
// publishes it again, with the same IDs (a duplicate, never a loss): the
// inbox, or any receiver deduplicating by ID, absorbs it. Transactions
// that write the same key concurrently are published in the order of
// their inserts' IDs where both are visible, else as their commits make
// them visible. Messages may be scheduled ([PublishAt], [After]): they
// stay in the table until due. Sent messages are deleted after an hour,
// inbox records after seven days ([Cleanup]).
//
// On PostgreSQL a commit of outbox messages notifies the relays
// (LISTEN/NOTIFY) when they are idle; a relay that published in the last
// second polls every 10 ms instead, and publishers skip the notification
// then. PostgreSQL serializes the commits of notifying transactions
// through their WAL flush, so notifying on every commit would cap a busy
// database at one commit per flush. Without notifications (MySQL,
// SQLite, Notify(false)) relays poll every 100 ms when idle ([Poll]).
//
// Inbox: [Once] and the [Inbox] middleware run a handler in a
// transaction that first records (group, message ID); a redelivery of a
// recorded ID is settled without running the handler, and a delivery
// running while the first is still in its transaction waits for it and
// then finds the ID. A handler that fails rolls its writes and the record
// back, and runs again on the next delivery. Exactly once holds for what
// the handler writes in the transaction; other side effects (a call to
// another service) happen at least once.
//
// Sagas: a [Saga] of state type S is stored as JSON, keyed by its name
// and a correlation key taken from each message ([Start], [Handle]). A
// step runs in one transaction with the inbox record of its message, the
// saga's new state and what it sends (through the outbox): all or
// nothing. Two steps of one saga racing (two instances) both read version
// n; the first to commit writes n+1, the other's update finds no row at
// n ([ErrConflict]) and its message is retried, so no update is lost.
// Timeouts ([Instance.Timeout]) are commands to the service itself,
// scheduled in the outbox, so they survive restarts; a timeout set again
// or cancelled is settled unhandled when it fires. [Instance.Compensate]
// runs the compensation steps recorded so far, the last first, and ends
// the saga; [Instance.Complete] ends it; an ended saga is deleted, or
// kept with its status ([Archive]). A saga whose stored state does not
// decode dead-letters the message with the reason ([ErrSagaState]) and
// stays as it is.
//
// # Errors
//
// Errors wrap the package's sentinels ([ErrTxDone] for a transaction
// already committed or rolled back, [ErrConflict], [ErrSchemaNewer],
// [ErrSagaState]) or omnibus.ErrInvalid for bad arguments, with the
// driver's error reachable with errors.As; [Retryable] tells the errors
// a database returns for a transaction it aborted (deadlock,
// serialization failure, SQLite busy). A send under a transaction on a
// bus without the [Outbox] middleware fails with bus.ErrNoOutbox rather
// than publish before the commit.
//
// # Concurrency
//
// A store, a relay and the sagas may be used from any goroutine.
// [Relay.Run] runs its workers (Workers, default 4), the cleaner and, on
// PostgreSQL, the listener that holds one connection of the pool, and
// returns when they have ended. Sagas' steps run on the bus's handler
// goroutines.
package sqlbus
