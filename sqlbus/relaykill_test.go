package sqlbus_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/kafkabus"
	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// kafkaParams make group membership react in test time.
const kafkaParams = "heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s"

// kafkaURL starts a kfake cluster in the test process (child processes
// reach it over TCP), closed when t ends.
func kafkaURL(t testing.TB) string {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(-1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?" + kafkaParams
}

// TestRelayKilled: two relay processes publish the outbox to Kafka while
// messages are committed, and are killed with SIGKILL at random points
// and started again, several times. Every message arrives, with its ID;
// duplicates (a relay killed between publishing and marking) are
// counted; per key, no message arrives for the first time after a newer
// one did.
func TestRelayKilled(t *testing.T) {
	const messages, keys, kills = 1000, 20, 5
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			drv, dsn := db.dsn(t)
			sdb := openDSN(t, drv, dsn)
			st := newStore(t, sdb, db.dialect)
			busURL := kafkaURL(t)
			c := openBus(t, busURL)
			col := &collector{}
			consume(t, c, "events", col)
			cs := newChildren(t)
			cfg := childConfig{Role: "relay", Driver: drv, DSN: dsn, Dialect: db.dialect, Prefix: st.Prefix(), BusURL: busURL, Notify: true}
			names := []string{"relay-a", "relay-b"}
			for _, n := range names {
				cs.start(n, cfg)
			}
			ctx := testCtx(t, 2*time.Minute)

			// Publish in transactions of 10 while the relays run and die.
			published := make(chan error, 1)
			go func() {
				published <- func() error {
					for i := 0; i < messages; i += 10 {
						tx, err := sdb.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						for j := i; j < i+10; j++ {
							m := &omnibus.Message{ID: fmt.Sprintf("m%05d", j), Key: fmt.Sprint("k", j%keys)}
							if err := sqlbus.Publish(ctx, st, tx, "events", m); err != nil {
								_ = tx.Rollback()
								return err
							}
						}
						if err := tx.Commit(); err != nil {
							return err
						}
						if i%200 == 0 {
							time.Sleep(20 * time.Millisecond)
						}
					}
					return nil
				}()
			}()
			for range kills {
				time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
				n := names[rand.IntN(len(names))]
				cs.kill(n)
				cs.start(n, cfg)
			}
			if err := <-published; err != nil {
				t.Fatal(err)
			}
			transporttest.Eventually(t, 90*time.Second, func() bool {
				if out, ok := cs.exited(); ok {
					t.Fatal(out)
				}
				return col.unique() == messages
			}, func() string { return fmt.Sprintf("received %d of %d messages", col.unique(), messages) })
			pending, err := st.Pending(ctx)
			if err != nil {
				t.Fatal(err)
			}
			transporttest.Eventually(t, 10*time.Second, func() bool { pending, _ = st.Pending(ctx); return pending == 0 },
				func() string { return fmt.Sprintf("%d messages not marked sent", pending) })

			col.mu.Lock()
			defer col.mu.Unlock()
			checkFirstSeenOrder(t, col.msgs)
			dups := 0
			for _, n := range col.seen {
				dups += n - 1
			}
			t.Logf("%d messages, %d relay kills, %d duplicates (published again after a kill)", messages, cs.kills, dups)
		})
	}
}

// checkFirstSeenOrder fails t when, per key, a message arrives for the
// first time after a newer one (IDs increase with the order).
func checkFirstSeenOrder(t testing.TB, msgs []*omnibus.Message) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]string{}
	for _, m := range msgs {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		if p, ok := last[m.Key]; ok && m.ID < p {
			t.Errorf("key %s: %s arrived first after %s", m.Key, m.ID, p)
			return
		}
		last[m.Key] = m.ID
	}
}
