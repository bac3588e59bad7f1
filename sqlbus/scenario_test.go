package sqlbus_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/rabbitbus"
	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The bank scenario's size. Each of its six runs (three databases, two
// transports) takes about a minute at 2,000 transfers on a two-core
// machine, so CI runs 400 with as many kills; SQLBUS_TRANSFERS sets the
// count (SQLBUS_TRANSFERS=2000 for the full run).
const (
	bankAccounts = 50
	bankBalance  = 1000
)

// bankKills is how many times the scenario kills a child; SQLBUS_BANK_KILLS
// sets it (0, to tell a failure's cause).
var bankKills = func() int {
	if n, err := strconv.Atoi(os.Getenv("SQLBUS_BANK_KILLS")); err == nil && n >= 0 {
		return n
	}
	return 5
}()

var bankTransfers = func() int {
	if n, err := strconv.Atoi(os.Getenv("SQLBUS_TRANSFERS")); err == nil && n > 0 {
		return n
	}
	return 400
}()

var (
	rabbitURL  = testenv.Getenv("RABBITBUS_URL", "amqp://guest:guest@127.0.0.1:5672/")
	rabbitAddr = testenv.Getenv("RABBITBUS_ADDR", "127.0.0.1:5672")
)

// scenarioTransport is a transport the bank scenario runs on: url
// returns its URL for namespace ns, and removes what the scenario
// created on a shared server when t ends.
type scenarioTransport struct {
	name string
	url  func(t testing.TB, ns string) string
}

var scenarioTransports = []scenarioTransport{
	{name: "kafka", url: func(t testing.TB, ns string) string {
		// Members of killed processes leave the group after the session
		// timeout: kept short.
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(200*time.Millisecond))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		t.Cleanup(c.Close)
		return "kafka://" + strings.Join(c.ListenAddrs(), ",") +
			"?heartbeat_interval=100ms&session_timeout=1500ms&rebalance_timeout=10s&fetch_max_wait=50ms&metadata_max_age=1s"
	}},
	{name: "rabbitmq", url: func(t testing.TB, ns string) string {
		testenv.Require(t, "RabbitMQ", rabbitAddr, "rabbitmq-server -detached")
		t.Cleanup(func() { deleteRabbit(t, ns) })
		return rabbitURL
	}},
}

// TestBankScenario: 2,000 transfers (400 in CI, see bankTransfers) between 50 accounts, on every
// database and on Kafka (a log) and RabbitMQ (a broker), handled by two
// instances of the bank service with two relays, all four child
// processes that the test kills with SIGKILL at random points and starts
// again, several times. Afterwards the money is all there, every
// account entry was written once (the inbox), every transfer's
// settlement event was published (the outbox), and every saga ended,
// completed (after its settle timeout, which fires across restarts) or
// compensated.
func TestBankScenario(t *testing.T) {
	for _, tr := range scenarioTransports {
		for _, db := range databases {
			t.Run(tr.name+"/"+db.name, func(t *testing.T) {
				t.Parallel() // two at a time (-parallel is GOMAXPROCS): they wait on kills and sessions more than they run
				bankScenario(t, tr, db)
			})
		}
	}
}

func bankScenario(t *testing.T, tr scenarioTransport, db database) {
	start := time.Now()
	ctx := testCtx(t, max(4*time.Minute, time.Duration(bankTransfers)*200*time.Millisecond))
	drv, dsn := db.dsn(t)
	sdb := openDSN(t, drv, dsn)
	st := newStore(t, sdb, db.dialect)
	bankPrefix := st.Prefix() + "bank_"
	t.Cleanup(func() {
		for _, table := range []string{"account", "entry"} {
			_, _ = sdb.Exec("DROP TABLE IF EXISTS " + bankPrefix + table)
		}
	})
	if err := bankTables(ctx, sdb, db.dialect, bankPrefix, bankAccounts, bankBalance); err != nil {
		t.Fatal(err)
	}
	ns := strings.TrimSuffix(st.Prefix(), "_")
	busURL := tr.url(t, ns)
	c := openBus(t, busURL)
	teller, err := bus.New(c, "teller", bus.Namespace(ns), bus.UseSend(sqlbus.Outbox(st)))
	if err != nil {
		t.Fatal(err)
	}
	audit := &collector{}
	consume(t, c, teller.EventTopic("bank"), audit)

	cs := newChildren(t)
	bank := childConfig{Role: "bank", Driver: drv, DSN: dsn, Dialect: db.dialect, Prefix: st.Prefix(), BusURL: busURL, Namespace: ns}
	relay := bank
	relay.Role, relay.Prefix, relay.Notify = "relay", st.Prefix(), true
	cfgs := map[string]childConfig{"bank-1": bank, "bank-2": bank, "relay-1": relay, "relay-2": relay}
	names := []string{"bank-1", "bank-2", "relay-1", "relay-2"}
	for _, n := range names {
		cs.start(n, cfgs[n])
	}
	for _, n := range names[:2] {
		cs.waitReady(n, time.Minute)
	}

	// The teller commits transfers in batches while the children die.
	sent := make(chan error, 1)
	go func() {
		sent <- func() error {
			for i := 0; i < bankTransfers; i += 20 {
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				var reqs []any
				for j := i; j < i+20; j++ {
					from := rand.IntN(bankAccounts)
					to := (from + 1 + rand.IntN(bankAccounts-1)) % bankAccounts
					reqs = append(reqs, TransferRequested{ID: fmt.Sprintf("tr%05d", j), From: from, To: to, Amount: 1 + rand.IntN(100)})
				}
				if err := teller.Send(bus.WithTx(ctx, tx), "bank", reqs...); err != nil {
					_ = tx.Rollback()
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				time.Sleep(time.Duration(50_000/bankTransfers) * time.Millisecond) // the sending spans the kills
			}
			return nil
		}()
	}()
	// Every child is killed at least once, then random ones; each kill
	// waits until transfers settled since the last, so that it falls
	// while they flow (timeouts pending, batches in flight), however
	// slow the machine.
	order := slices.Clone(names)
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	progress := 0
	for k := range bankKills {
		transporttest.Eventually(t, 2*time.Minute, func() bool {
			n := settledCount(audit)
			return n > progress || n == bankTransfers
		}, func() string { return fmt.Sprintf("no transfer settled after %d (kill %d)", progress, k+1) })
		progress = settledCount(audit)
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		n := names[rand.IntN(len(names))]
		if k < len(order) {
			n = order[k]
		}
		cs.kill(n)
		cs.start(n, cfgs[n])
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	sentAt := time.Since(start)

	var problems []string
	var outcomes map[string]int
	transporttest.Eventually(t, max(3*time.Minute, time.Duration(bankTransfers)*150*time.Millisecond), func() bool {
		if out, ok := cs.exited(); ok {
			t.Fatal(out)
		}
		problems, outcomes = checkBank(ctx, t, st, bankPrefix, audit, cs)
		return len(problems) == 0
	}, func() string { return fmt.Sprintf("%d problems: %v", len(problems), problems) })
	audit.mu.Lock()
	dups := len(audit.msgs) - len(audit.seen)
	audit.mu.Unlock()
	t.Logf("%d transfers (%v), %d kills, settled in %v (sent in %v); events delivered twice to the auditor: %d",
		bankTransfers, outcomes, cs.kills, time.Since(start).Round(time.Millisecond), sentAt.Round(time.Millisecond), dups)
}

// settledCount counts the transfers whose settlement the auditor saw.
func settledCount(audit *collector) int {
	audit.mu.Lock()
	defer audit.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range audit.msgs {
		if m.Type == "sqlbus_test.TransferSettled" {
			seen[m.Key] = true
		}
	}
	return len(seen)
}

// checkBank returns what is wrong with the bank now (nothing once the
// scenario is done) and the transfers' outcomes.
func checkBank(ctx context.Context, t *testing.T, st *sqlbus.SQLStore, bp string, audit *collector, cs *children) ([]string, map[string]int) {
	var problems []string
	add := func(format string, args ...any) {
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	q := func(query string, args []any, scan func(*sql.Rows) error) {
		rows, err := st.DB().QueryContext(ctx, query, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Every saga ended; the outcome of each.
	outcome := map[string]string{}
	counts := map[string]int{}
	q(st.Dialect().Rebind("SELECT saga_key, status, state FROM "+st.Prefix()+"saga WHERE saga = ?"), []any{"transfer"}, func(r *sql.Rows) error {
		var key, status string
		var state []byte
		if err := r.Scan(&key, &status, &state); err != nil {
			return err
		}
		var s TransferState
		if err := json.Unmarshal(state, &s); err != nil {
			return err
		}
		if status == sqlbus.StatusRunning {
			add("saga %s still running", key)
		}
		outcome[key] = s.Outcome
		counts[status+"/"+s.Outcome]++
		if at, ok := cs.killedAt(s.TimeoutSetBy); ok && s.TimeoutFired.After(at) {
			counts["timeouts fired after their setter was killed"]++
		}
		return nil
	})
	if len(outcome) != bankTransfers {
		add("%d sagas, want %d", len(outcome), bankTransfers)
	}
	// The money is all there.
	var sum, least int64
	q("SELECT SUM(balance), MIN(balance) FROM "+bp+"account", nil, func(r *sql.Rows) error { return r.Scan(&sum, &least) })
	if sum != bankAccounts*bankBalance || least < 0 {
		add("balances sum to %d (want %d), least %d", sum, bankAccounts*bankBalance, least)
	}
	// Each transfer's entries were written once, as its outcome says.
	entries := map[string]map[string]int{}
	q("SELECT transfer, kind, COUNT(*) FROM "+bp+"entry GROUP BY transfer, kind", nil, func(r *sql.Rows) error {
		var tr, kind string
		var n int
		if err := r.Scan(&tr, &kind, &n); err != nil {
			return err
		}
		if entries[tr] == nil {
			entries[tr] = map[string]int{}
		}
		entries[tr][kind] = n
		return nil
	})
	want := map[string]string{"completed": "map[credit:1 debit:1]", "refunded": "map[debit:1 refund:1]", "rejected": "map[]"}
	for tr, o := range outcome {
		if got := fmt.Sprint(entries[tr]); got != want[o] && !(o == "rejected" && entries[tr] == nil) {
			add("transfer %s (%s): entries %s, want %s", tr, o, got, want[o])
		}
	}
	// Every settlement was published, as the saga ended.
	audit.mu.Lock()
	settled := map[string]string{}
	for _, m := range audit.msgs {
		if m.Type == "sqlbus_test.TransferSettled" {
			var s TransferSettled
			_ = json.Unmarshal(m.Body, &s)
			settled[s.Transfer] = s.Outcome
		}
	}
	audit.mu.Unlock()
	if len(settled) != bankTransfers {
		add("%d settlements published, want %d", len(settled), bankTransfers)
	}
	for tr, o := range outcome {
		if settled[tr] != o {
			add("transfer %s: settlement %q published, saga's outcome %q", tr, settled[tr], o)
			break
		}
	}
	if n, err := st.Pending(ctx); err != nil || n != 0 {
		add("%d messages in the outbox (%v)", n, err)
	}
	if bankKills >= 4 && counts["timeouts fired after their setter was killed"] == 0 { // both bank instances were killed
		add("no settle timeout fired after the process that set it was killed")
	}
	sort.Strings(problems)
	return problems, counts
}

// deleteRabbit removes the exchanges and queues of namespace ns (all
// their names start with it) from the RabbitMQ server.
func deleteRabbit(t testing.TB, ns string) { testenv.DeleteRabbit(t, rabbitURL, ns) }
