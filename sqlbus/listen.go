package sqlbus

// LISTEN/NOTIFY on PostgreSQL: InsertOutbox notifies the store's channel
// in the user's transaction (PostgreSQL delivers it at commit), and
// Listen holds a connection of the pool that waits for it.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	omnidriver "github.com/omnibus-go/omnibus/driver"
)

// channel is the NOTIFY channel of the store's outbox.
func (s *SQLStore) channel() string { return s.prefix + "outbox" }

// Notifies implements Notifier: PostgreSQL notifies.
func (s *SQLStore) Notifies() bool { return s.d == Postgres }

// Listen implements Notifier on PostgreSQL (with pgx's database/sql
// driver, github.com/jackc/pgx/v5/stdlib): it takes a connection out of
// the pool for as long as it runs, LISTENs on the outbox's channel and
// calls wake for each notification, and once after each (re)connection,
// since notifications sent while it was away are lost. It reconnects
// with backoff until ctx ends. On the other dialects it returns an error
// wrapping errors.ErrUnsupported at once.
func (s *SQLStore) Listen(ctx context.Context, wake func()) error {
	if s.d != Postgres {
		return fmt.Errorf("sqlbus: listen on %s: %w", s.d, errors.ErrUnsupported)
	}
	for attempt := 1; ; attempt++ {
		err := s.listenOnce(ctx, wake, func() { attempt = 0 })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errors.ErrUnsupported) {
			return err
		}
		s.log.Warn("sqlbus: listen for outbox notifications", "channel", s.channel(), "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(omnidriver.Backoff(attempt, 100*time.Millisecond, 5*time.Second)):
		}
	}
}

// listenOnce listens on one connection until it fails or ctx ends.
func (s *SQLStore) listenOnce(ctx context.Context, wake, connected func()) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("sqlbus: LISTEN needs pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib), not %T: %w", dc, errors.ErrUnsupported)
		}
		c := pc.Conn()
		if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel()}.Sanitize()); err != nil {
			return badConn(err)
		}
		connected()
		wake()
		for {
			if _, err := c.WaitForNotification(ctx); err != nil {
				// The connection is unusable after a cancelled wait: the
				// pool must drop it, not hand it out still listening.
				return badConn(err)
			}
			wake()
		}
	})
}

func badConn(err error) error { return errors.Join(err, driver.ErrBadConn) }
