package sqlbus_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	_ "github.com/omnibus-go/omnibus/membus"
	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// each runs fn on every database, with a store of tables of its own.
func each(t *testing.T, fn func(t *testing.T, st *sqlbus.SQLStore)) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			fn(t, newStore(t, openDB(t, db), db.dialect))
		})
	}
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// openBus opens a client, closed when t ends.
func openBus(t testing.TB, rawURL string) *omnibus.Client {
	t.Helper()
	c, err := omnibus.Open(testCtx(t, 30*time.Second), rawURL)
	if err != nil {
		t.Fatalf("Open(%s): %v", omnibus.RedactURL(rawURL), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// runRelay runs a relay of st on c until t ends.
func runRelay(t testing.TB, st sqlbus.Store, c *omnibus.Client, opts ...sqlbus.RelayOption) *sqlbus.Relay {
	t.Helper()
	r, err := sqlbus.NewRelay(st, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// collector records what a consumer receives, by ID.
type collector struct {
	mu   sync.Mutex
	seen map[string]int
	msgs []*omnibus.Message
}

func (c *collector) handle(_ context.Context, m *omnibus.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[m.ID]++
	cp := *m
	c.msgs = append(c.msgs, &cp)
	return nil
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// consume subscribes to topic from its start, until t ends.
func consume(t testing.TB, c *omnibus.Client, topic string, col *collector) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	if err := c.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	opts := []omnibus.SubscribeOption{omnibus.Group("g")}
	if c.Capabilities().Replay {
		opts = append(opts, omnibus.StartFrom(omnibus.StartEarliest))
	}
	k, err := c.Subscribe(ctx, topic, col.handle, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = k.Run(context.Background())
	}()
	t.Cleanup(func() {
		_ = k.Close()
		<-done
	})
}

func inTx(t testing.TB, st sqlbus.Store, fn func(tx *sql.Tx) error) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
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

// TestOutbox: what a committed transaction wrote is published, with its
// fields; what a rolled back one wrote is not; scheduled messages wait
// for their time; sent rows are cleaned up.
func TestOutbox(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		col := &collector{}
		consume(t, c, "orders", col)
		relay := runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))

		inTx(t, st, func(tx *sql.Tx) error {
			return sqlbus.Publish(ctx, st, tx, "orders", &omnibus.Message{ID: "m1", Key: "o-1", Type: "shop.OrderPlaced",
				Source: "orders", ContentType: "application/json", Headers: map[string]string{"tenant": "acme"}, Body: []byte(`{"n":1}`)})
		})
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := sqlbus.Publish(ctx, st, tx, "orders", &omnibus.Message{ID: "rolled-back"}); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback()
		inTx(t, st, func(tx *sql.Tx) error {
			return sqlbus.PublishAt(ctx, st, tx, time.Now().Add(300*time.Millisecond), "orders", &omnibus.Message{ID: "later"})
		})
		start := time.Now()
		transporttest.Eventually(t, 10*time.Second, func() bool { return col.unique() == 2 },
			func() string { return fmt.Sprintf("received %v, want m1 and later", col.seen) })
		col.mu.Lock()
		m := col.msgs[0]
		if col.msgs[1].ID != "later" || time.Since(start) < 250*time.Millisecond {
			t.Errorf("the scheduled message came %v after the start, second %q", time.Since(start), col.msgs[1].ID)
		}
		col.mu.Unlock()
		if m.ID != "m1" || m.Key != "o-1" || m.Type != "shop.OrderPlaced" || m.Source != "orders" || m.ContentType != "application/json" ||
			m.Headers["tenant"] != "acme" || string(m.Body) != `{"n":1}` || m.Time.IsZero() {
			t.Errorf("received %+v", m)
		}
		if col.seen["rolled-back"] != 0 {
			t.Error("a rolled back message was published")
		}
		// The relay counts after its commit, which follows the publish.
		transporttest.Eventually(t, 5*time.Second, func() bool { return relay.Stats().Published == 2 },
			func() string { return fmt.Sprintf("Stats().Published = %d, want 2", relay.Stats().Published) })

		// Cleanup deletes sent rows older than kept.
		r2, err := sqlbus.NewRelay(st, c, sqlbus.Cleanup(time.Minute, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if n, err := r2.Clean(ctx); err != nil || n != 2 {
			t.Errorf("Clean = %d, %v; want the 2 sent rows", n, err)
		}
	})
}

// TestOutboxBus: the bus's Send, Publish and Reply under a transaction
// go through the outbox; a Request under one is refused; a send under a
// transaction without the outbox middleware fails.
func TestOutboxBus(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		ns := bus.Namespace(st.Prefix() + "ns")
		got := make(chan string, 10)
		billing, err := bus.New(c, "billing", ns, bus.UseSend(sqlbus.Outbox(st)))
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.HandleCommand(billing, func(ctx context.Context, inv bus.Invocation, cmd charge) error {
			got <- "command " + cmd.Order
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := billing.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer billing.Close()
		orders, err := bus.New(c, "orders", ns, bus.UseSend(sqlbus.Outbox(st)))
		if err != nil {
			t.Fatal(err)
		}
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := orders.Send(bus.WithTx(ctx, tx), "billing", charge{Order: "o-1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Request[charge](bus.WithTx(ctx, tx), orders, "billing", charge{Order: "o-2"}); !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Request under a transaction: %v; want ErrInvalid", err)
		}
		if n, _ := st.Pending(ctx); n != 0 {
			t.Errorf("pending before the commit, seen from outside: %d", n)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n, _ := st.Pending(ctx); n != 1 {
			t.Errorf("pending after the commit: %d, want 1", n)
		}
		select {
		case s := <-got:
			t.Fatalf("handled %q before any relay ran", s)
		case <-time.After(200 * time.Millisecond):
		}
		runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))
		select {
		case s := <-got:
			if s != "command o-1" {
				t.Fatalf("handled %q", s)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the command sent in the transaction was not handled")
		}

		// Without the middleware the send fails, and nothing is published.
		plain, err := bus.New(c, "plain", ns)
		if err != nil {
			t.Fatal(err)
		}
		inTx(t, st, func(tx *sql.Tx) error {
			if err := plain.Send(bus.WithTx(ctx, tx), "billing", charge{Order: "o-3"}); !errors.Is(err, bus.ErrNoOutbox) {
				return fmt.Errorf("send under a transaction without the outbox: %v; want ErrNoOutbox", err)
			}
			return nil
		})
		select {
		case s := <-got:
			t.Fatalf("handled %q", s)
		case <-time.After(200 * time.Millisecond):
		}
	})
}

type charge struct {
	Order string `json:"order"`
}

func (c charge) MessageKey() string { return c.Order }
