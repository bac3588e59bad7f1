package sqlbus_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The trip saga's messages: book a flight and a hotel; a hotel that
// fails cancels the flight.
type (
	BookTrip struct {
		Trip  string `json:"trip"`
		Hotel string `json:"hotel"`
	}
	FlightBooked struct {
		Trip   string `json:"trip"`
		Flight string `json:"flight"`
	}
	HotelFailed struct {
		Trip string `json:"trip"`
	}
	Bump struct {
		Trip string `json:"trip"`
	}
	Bumped struct {
		Trip string `json:"trip"`
	}
	TripState struct {
		Hotel   string   `json:"hotel"`
		Flight  string   `json:"flight"`
		Steps   []string `json:"steps"`
		Timeout bool     `json:"timeout"`
	}
)

func (m BookTrip) MessageKey() string     { return m.Trip }
func (m FlightBooked) MessageKey() string { return m.Trip }
func (m HotelFailed) MessageKey() string  { return m.Trip }
func (m Bump) MessageKey() string         { return m.Trip }
func (m Bumped) MessageKey() string       { return m.Trip }

// tripService is one instance of the trips service with its saga, on
// client c and store st.
type tripService struct {
	b        *bus.Bus
	sagas    *sqlbus.Sagas
	saga     *sqlbus.Saga[TripState]
	mu       sync.Mutex
	cancels  []string // flights cancelled by compensation
	timeouts []string
	release  chan struct{} // a Bump step waits for it when set
	entered  chan struct{}
	held     atomic.Bool
}

func newTripService(t *testing.T, c *omnibus.Client, st sqlbus.Store, ns string) *tripService {
	t.Helper()
	b, err := bus.New(c, "trips", bus.Namespace(ns), bus.UseSend(sqlbus.Outbox(st)),
		bus.Subscribe(omnibus.Backoff(10*time.Millisecond, 50*time.Millisecond), omnibus.MaxAttempts(20)))
	if err != nil {
		t.Fatal(err)
	}
	ts := &tripService{b: b}
	ts.sagas, err = sqlbus.NewSagas(b, st)
	if err != nil {
		t.Fatal(err)
	}
	ts.saga, err = sqlbus.NewSaga[TripState](ts.sagas, "trip", sqlbus.Archive(true))
	if err != nil {
		t.Fatal(err)
	}
	s := ts.saga
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(sqlbus.Start(s, sqlbus.Commands(), nil, func(ctx context.Context, inst *sqlbus.Instance[TripState], m BookTrip) error {
		inst.State.Hotel = m.Hotel
		inst.State.Steps = append(inst.State.Steps, "book")
		// The flight is "booked" by publishing the event the saga waits for.
		return b.Publish(ctx, FlightBooked{Trip: m.Trip, Flight: "F-" + m.Trip})
	}))
	check(sqlbus.Handle(s, sqlbus.Events("trips"), nil, func(ctx context.Context, inst *sqlbus.Instance[TripState], m FlightBooked) error {
		inst.State.Flight = m.Flight
		inst.State.Steps = append(inst.State.Steps, "flight")
		if err := inst.AddCompensation("cancel-flight", m.Flight); err != nil {
			return err
		}
		if inst.State.Hotel == "full" {
			return b.Publish(ctx, HotelFailed{Trip: m.Trip})
		}
		return inst.Timeout(ctx, "confirm", 300*time.Millisecond)
	}))
	check(sqlbus.Handle(s, sqlbus.Events("trips"), nil, func(ctx context.Context, inst *sqlbus.Instance[TripState], m HotelFailed) error {
		inst.State.Steps = append(inst.State.Steps, "hotel-failed")
		inst.Compensate()
		return nil
	}))
	check(sqlbus.Compensation(s, "cancel-flight", func(ctx context.Context, inst *sqlbus.Instance[TripState], flight string) error {
		ts.mu.Lock()
		ts.cancels = append(ts.cancels, flight)
		ts.mu.Unlock()
		inst.State.Steps = append(inst.State.Steps, "cancel "+flight)
		return nil
	}))
	s.OnTimeout(func(ctx context.Context, inst *sqlbus.Instance[TripState], name string) error {
		ts.mu.Lock()
		ts.timeouts = append(ts.timeouts, inst.Key()+" "+name)
		ts.mu.Unlock()
		inst.State.Timeout = true
		inst.State.Steps = append(inst.State.Steps, "timeout "+name)
		inst.Complete()
		return nil
	})
	bump := func(ctx context.Context, inst *sqlbus.Instance[TripState]) error {
		if ts.release != nil && ts.held.CompareAndSwap(false, true) {
			ts.entered <- struct{}{}
			<-ts.release // hold the first reader: the other step commits first
		}
		inst.State.Steps = append(inst.State.Steps, "bump")
		return nil
	}
	check(sqlbus.Handle(s, sqlbus.Commands(), nil, func(ctx context.Context, inst *sqlbus.Instance[TripState], m Bump) error { return bump(ctx, inst) }))
	check(sqlbus.Handle(s, sqlbus.Events("trips"), nil, func(ctx context.Context, inst *sqlbus.Instance[TripState], m Bumped) error { return bump(ctx, inst) }))
	return ts
}

// loadTrip reads the trip saga of key as stored.
func loadTrip(t *testing.T, st sqlbus.Store, key string) (sqlbus.SagaRow, bool) {
	t.Helper()
	var row sqlbus.SagaRow
	var ok bool
	inTx(t, st, func(tx *sql.Tx) (err error) {
		row, ok, err = st.LoadSaga(context.Background(), tx, "trip", key)
		return err
	})
	return row, ok
}

// TestSaga: a saga started by a command, found again by events, woken by
// its timeout, compensated, archived; what it sends goes through the
// outbox.
func TestSaga(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		ns := st.Prefix() + "ns"
		ts := newTripService(t, c, st, ns)
		if err := ts.b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ts.b.Close()
		runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))

		inTx(t, st, func(tx *sql.Tx) error {
			return ts.b.Send(bus.WithTx(ctx, tx), "trips", BookTrip{Trip: "t1", Hotel: "ritz"}, BookTrip{Trip: "t2", Hotel: "full"})
		})
		var r1, r2 sqlbus.SagaRow
		transporttest.Eventually(t, 20*time.Second, func() bool {
			r1, _ = loadTrip(t, st, "t1")
			r2, _ = loadTrip(t, st, "t2")
			return r1.Status == sqlbus.StatusCompleted && r2.Status == sqlbus.StatusCompensated
		}, func() string { return fmt.Sprintf("t1 %s %s, t2 %s %s", r1.Status, r1.State, r2.Status, r2.State) })
		if got, want := string(r1.State), `{"hotel":"ritz","flight":"F-t1","steps":["book","flight","timeout confirm"],"timeout":true}`; got != want {
			t.Errorf("t1's state %s, want %s", got, want)
		}
		if got, want := string(r2.State), `{"hotel":"full","flight":"F-t2","steps":["book","flight","hotel-failed","cancel F-t2"],"timeout":false}`; got != want {
			t.Errorf("t2's state %s, want %s", got, want)
		}
		ts.mu.Lock()
		if fmt.Sprint(ts.cancels) != "[F-t2]" || fmt.Sprint(ts.timeouts) != "[t1 confirm]" {
			t.Errorf("cancelled %v, timeouts %v", ts.cancels, ts.timeouts)
		}
		ts.mu.Unlock()
		// A message for an archived saga is settled unhandled.
		inTx(t, st, func(tx *sql.Tx) error { return ts.b.Send(bus.WithTx(ctx, tx), "trips", Bump{Trip: "t1"}) })
		transporttest.Eventually(t, 10*time.Second, func() bool { return ts.sagas.Stats().Finished > 0 },
			func() string { return fmt.Sprintf("stats %+v", ts.sagas.Stats()) })
	})
}

// TestSagaConflict: two steps of one saga at once (a command and an
// event), the first held after reading: the second commits first, the
// first's update conflicts and its message is retried, and no update is
// lost. SQLite has one writer: its steps never overlap.
func TestSagaConflict(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		if st.Dialect() == sqlbus.SQLite {
			t.Skip("SQLite: one writer, so steps are serialized and never conflict")
		}
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		ts := newTripService(t, c, st, st.Prefix()+"ns")
		ts.release, ts.entered = make(chan struct{}), make(chan struct{}, 1)
		if err := ts.b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ts.b.Close()
		runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))
		now := time.Now()
		inTx(t, st, func(tx *sql.Tx) error {
			return st.InsertSaga(ctx, tx, sqlbus.SagaRow{Name: "trip", Key: "t3", Status: sqlbus.StatusRunning,
				State: []byte(`{"steps":["start"]}`), Undo: []byte("[]"), Timeouts: []byte("{}"), Created: now, Updated: now})
		})
		inTx(t, st, func(tx *sql.Tx) error { return ts.b.Send(bus.WithTx(ctx, tx), "trips", Bump{Trip: "t3"}) })
		<-ts.entered // the command's step read version 1 and waits
		inTx(t, st, func(tx *sql.Tx) error { return ts.b.Publish(bus.WithTx(ctx, tx), Bumped{Trip: "t3"}) })
		var row sqlbus.SagaRow
		transporttest.Eventually(t, 10*time.Second, func() bool { row, _ = loadTrip(t, st, "t3"); return row.Version == 2 },
			func() string { return fmt.Sprintf("version %d, want the event's step committed", row.Version) })
		close(ts.release)
		transporttest.Eventually(t, 10*time.Second, func() bool { row, _ = loadTrip(t, st, "t3"); return row.Version == 3 },
			func() string { return fmt.Sprintf("version %d %s", row.Version, row.State) })
		if got := string(row.State); !strings.Contains(got, `"steps":["start","bump","bump"]`) {
			t.Errorf("state %s: an update was lost", got)
		}
		if n := ts.sagas.Stats().Conflicts; n < 1 {
			t.Errorf("Stats().Conflicts = %d, want at least 1", n)
		}
	})
}

// TestSagaUndecodable: a message for a saga whose stored state does not
// decode is dead-lettered with the reason, and the state is left as it
// is.
func TestSagaUndecodable(t *testing.T) {
	each(t, func(t *testing.T, st *sqlbus.SQLStore) {
		ctx := testCtx(t, time.Minute)
		c := openBus(t, "mem://"+st.Prefix())
		ns := st.Prefix() + "ns"
		ts := newTripService(t, c, st, ns)
		dead := &collector{}
		consume(t, c, ts.b.CommandTopic("trips")+".dlq", dead)
		if err := ts.b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ts.b.Close()
		runRelay(t, st, c, sqlbus.Poll(20*time.Millisecond))
		now := time.Now()
		inTx(t, st, func(tx *sql.Tx) error {
			return st.InsertSaga(ctx, tx, sqlbus.SagaRow{Name: "trip", Key: "t4", Status: sqlbus.StatusRunning,
				State: []byte(`{"steps": "not a list"}`), Undo: []byte("[]"), Timeouts: []byte("{}"), Created: now, Updated: now})
		})
		inTx(t, st, func(tx *sql.Tx) error { return ts.b.Send(bus.WithTx(ctx, tx), "trips", Bump{Trip: "t4"}) })
		transporttest.Eventually(t, 10*time.Second, func() bool { return dead.unique() == 1 },
			func() string { return "the message was not dead-lettered" })
		dead.mu.Lock()
		reason := dead.msgs[0].Headers[omnibus.HeaderDeadReason]
		dead.mu.Unlock()
		if !strings.Contains(reason, `saga "trip" "t4"`) || !strings.Contains(reason, sqlbus.ErrSagaState.Error()) {
			t.Errorf("dead-letter reason %q; want the saga and %q", reason, sqlbus.ErrSagaState)
		}
		row, _ := loadTrip(t, st, "t4")
		if row.Version != 1 || string(row.State) != `{"steps": "not a list"}` {
			t.Errorf("the state was touched: version %d, %s", row.Version, row.State)
		}
	})
}
