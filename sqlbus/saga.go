package sqlbus

// Sagas: typed state kept in the saga table, started and found again by
// messages of the bus, changed under optimistic concurrency, woken by
// timeouts that are scheduled commands in the outbox, compensated by
// steps run in reverse, and removed or archived when they end. Each
// step runs in one transaction with the inbox record, the state change
// and the messages it sends.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
)

// Sagas holds the sagas of a service instance (a bus) on a store, and
// receives their timeouts. The bus must send through the outbox
// (bus.UseSend(sqlbus.Outbox(st))): a saga's messages and timeouts are
// written in the transaction of its step. Create it, and the sagas, before
// the bus starts.
type Sagas struct {
	b  *bus.Bus
	st Store

	mu    sync.Mutex
	sagas map[string]timeoutRunner

	notFound, finished, conflicts atomic.Int64
}

// timeoutRunner is a saga, whatever its state type, as Sagas sees it.
type timeoutRunner interface {
	fire(ctx context.Context, inv bus.Invocation, t sagaTimeout) error
}

// sagaTimeout is the command a saga's timeout sends to its own service.
type sagaTimeout struct {
	Saga  string `json:"saga"`
	Key   string `json:"key"`
	Name  string `json:"name"`
	Token string `json:"token"`
}

// TypeSagaTimeout is the message type of the commands that carry sagas'
// timeouts.
const TypeSagaTimeout = "omnibus.sqlbus.SagaTimeout"

func (sagaTimeout) MessageType() string  { return TypeSagaTimeout }
func (t sagaTimeout) MessageKey() string { return t.Key }

// NewSagas returns the sagas of b on st, and registers on b the handler
// of their timeouts (a command of type TypeSagaTimeout).
func NewSagas(b *bus.Bus, st Store) (*Sagas, error) {
	if b == nil || st == nil {
		return nil, fmt.Errorf("sqlbus: NewSagas: nil bus or store: %w", omnibus.ErrInvalid)
	}
	sg := &Sagas{b: b, st: st, sagas: map[string]timeoutRunner{}}
	err := bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, t sagaTimeout) error {
		sg.mu.Lock()
		s := sg.sagas[t.Saga]
		sg.mu.Unlock()
		if s == nil {
			return omnibus.Permanent(fmt.Errorf("sqlbus: timeout %q of saga %q (key %q): no such saga in service %q", t.Name, t.Saga, t.Key, b.Service()))
		}
		return s.fire(ctx, inv, t)
	})
	if err != nil {
		return nil, err
	}
	return sg, nil
}

// SagaStats are counters of the sagas of a Sagas since NewSagas.
type SagaStats struct {
	NotFound  int64 // messages for a saga that does not exist (not a starting message), settled unhandled
	Finished  int64 // messages and timeouts for a saga that ended (archived) or a timeout cancelled, settled unhandled
	Conflicts int64 // steps that lost a race with another instance, retried
}

// Stats returns the counters.
func (sg *Sagas) Stats() SagaStats {
	return SagaStats{NotFound: sg.notFound.Load(), Finished: sg.finished.Load(), Conflicts: sg.conflicts.Load()}
}

// Saga is a kind of saga with state S, which encoding/json encodes (its
// exported fields). Create it with NewSaga and register its steps with
// Start and Handle.
type Saga[S any] struct {
	sg      *Sagas
	name    string
	archive bool

	mu           sync.Mutex
	onTimeout    func(ctx context.Context, inst *Instance[S], name string) error
	compensators map[string]func(ctx context.Context, inst *Instance[S], data []byte) error
}

// SagaOption configures a Saga.
type SagaOption func(*sagaConfig)

type sagaConfig struct{ archive bool }

// Archive keeps a saga that ended in the saga table, with its final
// state and status (completed or compensated), instead of deleting it;
// messages for it are then settled unhandled. Default: false (deleted).
func Archive(on bool) SagaOption { return func(c *sagaConfig) { c.archive = on } }

// NewSaga returns the saga named name (letters, digits, '.', '-', '_';
// the saga table's key with the correlation key) of sg.
func NewSaga[S any](sg *Sagas, name string, opts ...SagaOption) (*Saga[S], error) {
	if sg == nil {
		return nil, fmt.Errorf("sqlbus: NewSaga: nil Sagas: %w", omnibus.ErrInvalid)
	}
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("sqlbus: NewSaga: name %q: want 1 to 255 bytes: %w", name, omnibus.ErrInvalid)
	}
	var cfg sagaConfig
	for _, o := range opts {
		o(&cfg)
	}
	s := &Saga[S]{sg: sg, name: name, archive: cfg.archive, compensators: map[string]func(context.Context, *Instance[S], []byte) error{}}
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.sagas[name] != nil {
		return nil, fmt.Errorf("sqlbus: NewSaga: saga %q exists already: %w", name, bus.ErrDuplicateHandler)
	}
	sg.sagas[name] = s
	return s, nil
}

// Name is the saga's name.
func (s *Saga[S]) Name() string { return s.name }

// On says which messages a step takes: commands to the service, events
// of a service, or replies to the instance.
type On struct {
	kind bus.Kind
	from string
}

// Commands: the service's commands of the step's type.
func Commands() On { return On{kind: bus.Command} }

// Events: the events of the step's type published by service from.
func Events(from string) On { return On{kind: bus.Event, from: from} }

// Replies: the replies of the step's type to commands the instance sent.
// A reply reaches only the instance that sent the command: events and
// commands are what survives an instance's crash.
func Replies() On { return On{kind: bus.Reply} }

// Step is a saga's handler of messages of type M: it reads and changes
// inst.State, and sends under ctx (through the outbox, in the step's
// transaction). An error rolls everything back and retries the message.
type Step[S, M any] func(ctx context.Context, inst *Instance[S], m M) error

// Start registers step for messages of type M that start the saga: a
// message whose key (key(m); nil: M's MessageKey, see bus.Keyer) names
// no saga creates one with a zero state. One that names a running saga
// runs step on it; one that names a saga that ended is settled
// unhandled.
func Start[S, M any](s *Saga[S], on On, key func(M) string, step Step[S, M]) error {
	return register(s, on, key, true, step)
}

// Handle registers step for messages of type M of a running saga: those
// whose key names no running saga are settled unhandled (counted in
// SagaStats).
func Handle[S, M any](s *Saga[S], on On, key func(M) string, step Step[S, M]) error {
	return register(s, on, key, false, step)
}

func register[S, M any](s *Saga[S], on On, key func(M) string, start bool, step Step[S, M]) error {
	if step == nil {
		return fmt.Errorf("sqlbus: saga %q: nil step: %w", s.name, omnibus.ErrInvalid)
	}
	if key == nil {
		key = func(m M) string {
			if k, ok := any(m).(bus.Keyer); ok {
				return k.MessageKey()
			}
			return ""
		}
	}
	h := func(ctx context.Context, inv bus.Invocation, m M) error {
		return s.run(ctx, inv, key(m), start, func(ctx context.Context, inst *Instance[S]) error { return step(ctx, inst, m) })
	}
	switch on.kind {
	case bus.Command:
		return bus.HandleCommand(s.sg.b, h)
	case bus.Event:
		return bus.HandleEvent(s.sg.b, on.from, h)
	case bus.Reply:
		return bus.HandleReply(s.sg.b, h)
	}
	return fmt.Errorf("sqlbus: saga %q: On{} names no messages (use Commands, Events or Replies): %w", s.name, omnibus.ErrInvalid)
}

// OnTimeout sets the step run when one of the saga's timeouts fires
// (Instance.Timeout), with its name.
func (s *Saga[S]) OnTimeout(fn func(ctx context.Context, inst *Instance[S], name string) error) {
	s.mu.Lock()
	s.onTimeout = fn
	s.mu.Unlock()
}

// Compensation registers fn as the compensation step called name, with
// data of type D: Instance.AddCompensation records one (with its data)
// as the saga goes, and Instance.Compensate runs those recorded, the
// last first.
func Compensation[S, D any](s *Saga[S], name string, fn func(ctx context.Context, inst *Instance[S], data D) error) error {
	if fn == nil || name == "" {
		return fmt.Errorf("sqlbus: saga %q: compensation %q: nil step or empty name: %w", s.name, name, omnibus.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.compensators[name] != nil {
		return fmt.Errorf("sqlbus: saga %q: compensation %q: %w", s.name, name, bus.ErrDuplicateHandler)
	}
	s.compensators[name] = func(ctx context.Context, inst *Instance[S], raw []byte) error {
		var d D
		if err := json.Unmarshal(raw, &d); err != nil {
			return omnibus.Permanent(fmt.Errorf("sqlbus: saga %q %q: compensation %q: data: %v: %w", s.name, inst.key, name, err, ErrSagaState))
		}
		return fn(ctx, inst, d)
	}
	return nil
}

// fire runs the saga's timeout step for t, if the saga still waits for
// it (a timeout set again or cancelled leaves the old one unawaited).
func (s *Saga[S]) fire(ctx context.Context, inv bus.Invocation, t sagaTimeout) error {
	return s.run(ctx, inv, t.Key, false, func(ctx context.Context, inst *Instance[S]) error {
		if inst.timeouts[t.Name] != t.Token {
			inst.skip = true
			return nil
		}
		delete(inst.timeouts, t.Name)
		s.mu.Lock()
		fn := s.onTimeout
		s.mu.Unlock()
		if fn == nil {
			return omnibus.Permanent(fmt.Errorf("sqlbus: saga %q: timeout %q fired and the saga has no OnTimeout step", s.name, t.Name))
		}
		return fn(ctx, inst, t.Name)
	})
}

// run runs step on the saga of key in one transaction with the
// message's inbox record (or in the inbox middleware's transaction), and
// saves what it did.
func (s *Saga[S]) run(ctx context.Context, inv bus.Invocation, key string, start bool, step func(context.Context, *Instance[S]) error) error {
	if key == "" {
		return omnibus.Permanent(fmt.Errorf("sqlbus: saga %q: message %q of type %q has no correlation key", s.name, inv.ID(), inv.Message().Type))
	}
	inTx := func(ctx context.Context, tx *sql.Tx) error {
		return s.step(bus.WithTx(ctx, tx), tx, inv, key, start, step)
	}
	if tx := bus.TxFrom(ctx); tx != nil { // the inbox middleware's
		return inTx(ctx, tx)
	}
	_, err := Once(ctx, s.sg.st, s.sg.b.Service(), inv.ID(), inTx)
	return err
}

func (s *Saga[S]) step(ctx context.Context, tx *sql.Tx, inv bus.Invocation, key string, start bool, step func(context.Context, *Instance[S]) error) error {
	st := s.sg.st
	row, found, err := st.LoadSaga(ctx, tx, s.name, key)
	if err != nil {
		return err
	}
	inst := &Instance[S]{saga: s, key: key, tx: tx, inv: inv, timeouts: map[string]string{}, row: row, found: found}
	switch {
	case !found && !start:
		s.sg.notFound.Add(1)
		return nil
	case found && row.Status != StatusRunning:
		s.sg.finished.Add(1)
		return nil
	case found:
		if err := inst.decode(); err != nil {
			return omnibus.Permanent(fmt.Errorf("sqlbus: saga %q %q (version %d): %v: %w", s.name, key, row.Version, err, ErrSagaState))
		}
	}
	if err := step(ctx, inst); err != nil {
		return err
	}
	if inst.skip {
		s.sg.finished.Add(1)
		return nil
	}
	if inst.compensating {
		for i := len(inst.undo) - 1; i >= 0; i-- {
			u := inst.undo[i]
			s.mu.Lock()
			fn := s.compensators[u.Name]
			s.mu.Unlock()
			if fn == nil {
				return omnibus.Permanent(fmt.Errorf("sqlbus: saga %q %q: no compensation step %q (register it with Compensation)", s.name, key, u.Name))
			}
			if err := fn(ctx, inst, u.Data); err != nil {
				return err
			}
		}
		inst.undo, inst.status = nil, StatusCompensated
	}
	err = inst.save(ctx)
	if Retryable(err) {
		s.sg.conflicts.Add(1)
	}
	return err
}

// Instance is one saga as a step sees it: its state, its key, and what
// the step decides (complete, compensate, wait for a timeout). It is
// valid while the step runs.
type Instance[S any] struct {
	// State is the saga's state: zero in the step that starts it. What
	// the step leaves in it is saved.
	State S

	saga         *Saga[S]
	key          string
	tx           *sql.Tx
	inv          bus.Invocation
	row          SagaRow
	found        bool
	status       string // "" while running
	compensating bool
	skip         bool // a timeout no longer awaited: nothing to save
	undo         []undoStep
	timeouts     map[string]string // name -> token of the timeout awaited
}

type undoStep struct {
	Name string          `json:"name"`
	Data json.RawMessage `json:"data"`
}

// Key is the saga's correlation key.
func (i *Instance[S]) Key() string { return i.key }

// New reports whether the saga starts in this step.
func (i *Instance[S]) New() bool { return !i.found }

// Tx is the step's transaction: the inbox record, the saga's state and
// the messages sent under the step's ctx are written in it, and so may
// the step's own writes be.
func (i *Instance[S]) Tx() *sql.Tx { return i.tx }

// Invocation is the message being handled (for a timeout, the timeout's
// command).
func (i *Instance[S]) Invocation() bus.Invocation { return i.inv }

// Complete ends the saga when the step returns: it is deleted (or
// archived as completed, see Archive), its timeouts no longer fire and
// its recorded compensations are dropped.
func (i *Instance[S]) Complete() { i.status = StatusCompleted }

// Compensate ends the saga when the step returns nil, after running the
// compensation steps recorded with AddCompensation, the last first, in
// the step's transaction: it is then deleted (or archived as
// compensated).
func (i *Instance[S]) Compensate() { i.compensating = true }

// AddCompensation records the compensation step called name (see
// Compensation) with data, to run if the saga compensates.
func (i *Instance[S]) AddCompensation(name string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("sqlbus: saga %q %q: compensation %q: %w", i.saga.name, i.key, name, err)
	}
	i.undo = append(i.undo, undoStep{Name: name, Data: raw})
	return nil
}

// Timeout asks for the saga's OnTimeout step to run with name after d:
// a command to the service itself, written to the outbox in the step's
// transaction and published when due, so it survives restarts. Setting a
// timeout of the same name again replaces it: only the last one fires.
// ctx is the step's.
func (i *Instance[S]) Timeout(ctx context.Context, name string, d time.Duration) error {
	token := omnibus.NewID()
	b := i.saga.sg.b
	err := b.Send(After(ctx, d), b.Service(), sagaTimeout{Saga: i.saga.name, Key: i.key, Name: name, Token: token})
	if err != nil {
		return fmt.Errorf("sqlbus: saga %q %q: timeout %q: %w", i.saga.name, i.key, name, err)
	}
	i.timeouts[name] = token
	return nil
}

// CancelTimeout cancels the timeout called name: when it fires it is
// settled without running OnTimeout.
func (i *Instance[S]) CancelTimeout(name string) { delete(i.timeouts, name) }

// decode reads the stored state, compensations and timeouts.
func (i *Instance[S]) decode() error {
	if err := json.Unmarshal(i.row.State, &i.State); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := json.Unmarshal(i.row.Undo, &i.undo); err != nil {
		return fmt.Errorf("compensations: %w", err)
	}
	if err := json.Unmarshal(i.row.Timeouts, &i.timeouts); err != nil {
		return fmt.Errorf("timeouts: %w", err)
	}
	if i.timeouts == nil {
		i.timeouts = map[string]string{}
	}
	return nil
}

// save writes the saga back: inserted, updated at the next version, or
// (ended) deleted or archived.
func (i *Instance[S]) save(ctx context.Context) error {
	st, s := i.saga.sg.st, i.saga
	status := i.status
	if status == "" {
		status = StatusRunning
	}
	if status != StatusRunning && !s.archive {
		if !i.found {
			return nil
		}
		return st.DeleteSaga(ctx, i.tx, s.name, i.key, i.row.Version)
	}
	state, err := json.Marshal(i.State)
	if err != nil {
		return fmt.Errorf("sqlbus: saga %q %q: encode the state: %w", s.name, i.key, err)
	}
	undo, _ := json.Marshal(i.undo)
	timeouts, _ := json.Marshal(i.timeouts)
	if status != StatusRunning {
		undo, timeouts = []byte("[]"), []byte("{}")
	}
	now := time.Now()
	row := SagaRow{Name: s.name, Key: i.key, Status: status, Version: i.row.Version + 1, State: state, Undo: undo, Timeouts: timeouts, Created: i.row.Created, Updated: now}
	if !i.found {
		row.Created = now
		return st.InsertSaga(ctx, i.tx, row)
	}
	return st.UpdateSaga(ctx, i.tx, row)
}
