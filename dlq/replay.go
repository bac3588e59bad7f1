package dlq

// Replay: dead letters published again to their topic (or another) and
// then settled in the dead-letter topic, batch by batch, on the caller's
// goroutine.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// ReplayOptions say what Replay sends where.
type ReplayOptions struct {
	// Filter selects the dead letters replayed; the zero Filter selects
	// every one.
	Filter Filter
	// To is the topic they are published to. Default: each dead letter's
	// origin topic (omnibus-dead-topic); one without is left in place.
	To string
	// Batch is the most messages per publish. Default: 100.
	Batch int
	Bounds
}

// DeleteOptions say what Delete removes.
type DeleteOptions struct {
	// Filter selects the dead letters deleted; the zero Filter selects
	// every one.
	Filter Filter
	Bounds
}

// DefaultWindow is the default of Bounds.Window.
const DefaultWindow = 10000

// Bounds bound a Replay or a Delete.
type Bounds struct {
	// Window is the most dead letters held unselected while the rest is
	// read (a broker's are not acknowledged, a log's are kept to be
	// appended again); reading stops when it is full. Default:
	// DefaultWindow.
	Window int
	// WindowBytes bounds their sizes (body, key and headers). Default:
	// 256 MiB.
	WindowBytes int
	// Wait is the longest a read waits for a message the transport says
	// is there. Default: 10s.
	Wait time.Duration
	// Progress, when set, is called after each batch, on the goroutine
	// running Replay or Delete.
	Progress func(Progress)
}

// Progress counts what a Replay did so far.
type Progress struct {
	// Read counts the dead letters read.
	Read int
	// Selected counts those the filter selected.
	Selected int
	// Replayed counts those published again and settled.
	Replayed int
	// Deleted counts those settled without being published: by Delete,
	// and by Replay the copies of an ID it already replayed.
	Deleted int
	// Moved counts unselected dead letters appended to a log's
	// dead-letter topic again, so that its position could pass them.
	Moved int
	// NoTopic counts selected ones left in place because they name no
	// origin topic and ReplayOptions.To is empty.
	NoTopic int
	// Full is true when the window filled with unselected dead letters
	// before the topic was read to its end.
	Full bool
}

// publishTimeout bounds the publish and settlement of a batch once
// begun: a replay that is stopped finishes its batch, so that what was
// published is also settled.
const publishTimeout = time.Minute

// Replay publishes the selected dead letters again, each to its origin
// topic or to o.To, with the same key, type, source, time and body,
// without the dead-letter headers, under the ID of the replay
// (DeadLetter.ReplayID) and with the replay recorded (HeaderReplayedID,
// HeaderReplayedFrom, HeaderReplayedAt, HeaderReplays), then settles
// them in the dead-letter topic, so that it keeps the dead letters not
// selected (see the package documentation for how on each transport).
//
// Each dead letter is published once per Replay (a second copy of one in
// the dead-letter topic is settled without being published), before it
// is settled. A target topic that does not exist (where the transport can
// tell), and on a broker the origin group gone from the origin topic,
// stops the replay with an error wrapping ErrNotFound before anything is
// published there: nothing is settled that did not land. When ctx ends,
// Replay finishes the batch in progress (within a minute) and returns
// what it did with ctx's error.
func (q *Queue) Replay(ctx context.Context, o ReplayOptions) (Progress, error) {
	if o.Batch <= 0 {
		o.Batch = 100
	}
	if o.To == q.topic {
		return Progress{}, fmt.Errorf("dlq: replay %q to itself: %w", q.topic, omnibus.ErrInvalid)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &run{q: q, filter: o.Filter, bounds: o.Bounds, to: o.To, batch: o.Batch, replay: true,
		checked: map[[2]string]error{}, done: map[string]bool{}, at: time.Now()}
	if o.To != "" {
		if err := r.check(ctx, o.To, nil); err != nil {
			return r.p, err
		}
	}
	return r.run(ctx)
}

// Delete settles the selected dead letters without publishing them: they
// leave the dead-letter topic as a replay's do.
func (q *Queue) Delete(ctx context.Context, o DeleteOptions) (Progress, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &run{q: q, filter: o.Filter, bounds: o.Bounds, batch: 100, done: map[string]bool{}}
	return r.run(ctx)
}

// run is one Replay or Delete in progress.
type run struct {
	q       *Queue
	filter  Filter
	bounds  Bounds
	to      string
	batch   int
	replay  bool // else delete
	s       *session
	p       Progress
	checked map[[2]string]error // target topic and origin group: the check's result
	done    map[string]bool     // IDs replayed or deleted
	at      time.Time
}

func (r *run) run(ctx context.Context) (Progress, error) {
	b := r.bounds
	if b.Window <= 0 {
		b.Window = DefaultWindow
	}
	if b.WindowBytes <= 0 {
		b.WindowBytes = 256 << 20
	}
	s, err := r.q.open(ctx, sessionOptions{window: b.Window, bytes: b.WindowBytes, wait: b.Wait, republish: r.q.append})
	if err != nil {
		return r.p, err
	}
	defer s.close()
	r.s = s
	for {
		ds, err := s.next(ctx, pollEvery)
		switch {
		case errors.Is(err, errFull):
			r.p.Full = true
			return r.p, nil
		case err != nil:
			return r.p, err
		case ds == nil:
			return r.p, nil
		}
		if err := r.take(ctx, ds); err != nil {
			return r.p, err
		}
		if b.Progress != nil {
			b.Progress(r.p)
		}
	}
}

// selected is a dead letter on its way back.
type selected struct {
	d  *driver.Delivery
	dl *DeadLetter
}

// take replays or deletes the selected ones of ds, in order, target by
// target; the others stay held.
func (r *run) take(ctx context.Context, ds []*driver.Delivery) error {
	var order []string
	byTopic := map[string][]selected{}
	var again []*driver.Delivery // IDs already done: settled, not published
	for _, d := range ds {
		if r.s.isCopy(d) {
			continue // unselected already, and held
		}
		r.p.Read++
		dl := parse(d)
		if !r.filter.Match(dl) {
			if !r.s.ordered {
				d.Body = nil // held for its place only; an ordered lane's may be appended again
			}
			continue
		}
		r.p.Selected++
		if r.done[dl.ReplayID()] {
			again = append(again, d)
			continue
		}
		to := ""
		if r.replay {
			if to = r.to; to == "" {
				to = dl.OriginTopic
			}
			if to == "" {
				r.p.NoTopic++
				continue
			}
		}
		if byTopic[to] == nil {
			order = append(order, to)
		}
		byTopic[to] = append(byTopic[to], selected{d, dl})
	}
	if len(again) > 0 {
		if err := r.send(ctx, "", again); err != nil {
			return err
		}
	}
	for _, to := range order {
		sel := byTopic[to]
		if to != "" {
			for _, x := range sel {
				if err := r.check(ctx, to, x.dl); err != nil {
					return err
				}
			}
		}
		for len(sel) > 0 {
			if err := ctx.Err(); err != nil {
				return err // what is held goes back to the transport
			}
			n := min(len(sel), r.batch)
			ds := make([]*driver.Delivery, n)
			for i, x := range sel[:n] {
				ds[i] = x.d
			}
			if err := r.send(ctx, to, ds); err != nil {
				return err
			}
			sel = sel[n:]
			if r.bounds.Progress != nil && len(sel) > 0 {
				r.bounds.Progress(r.p)
			}
		}
	}
	return nil
}

// send publishes ds to topic (none when topic is empty) and settles what
// landed. It holds the session's work lock, so a revocation waits for
// it; it runs to its end (within publishTimeout) even when ctx ends.
func (r *run) send(ctx context.Context, topic string, ds []*driver.Delivery) error {
	s := r.s
	s.work.Lock()
	defer s.work.Unlock()
	ds = s.claimed(ds) // a lane revoked meanwhile is its next holder's
	if len(ds) == 0 {
		return nil
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	landed, err := ds, error(nil)
	if topic != "" {
		msgs := make([]*omnibus.Message, len(ds))
		for i, d := range ds {
			msgs[i] = parse(d).replayMessage(r.q.topic, r.at)
		}
		landed, err = r.q.publish(pctx, topic, ds, msgs)
	}
	if len(landed) > 0 {
		moved := s.moved
		if serr := s.settle(pctx, landed); serr != nil {
			if topic == "" {
				return serr
			}
			return fmt.Errorf("dlq: replay to %q: %d messages published, but not removed from %q (a later replay sends them again, with the same IDs): %w",
				topic, len(landed), r.q.topic, serr)
		}
		r.p.Moved += s.moved - moved
		for _, d := range landed {
			if topic != "" {
				r.p.Replayed++
			} else {
				r.p.Deleted++
			}
			r.done[parse(d).ReplayID()] = true
		}
	}
	if err != nil {
		return fmt.Errorf("dlq: replay to %q: %w", topic, err)
	}
	return nil
}

// publish publishes msgs (made of ds) to topic and returns the
// deliveries whose message landed.
func (q *Queue) publish(ctx context.Context, topic string, ds []*driver.Delivery, msgs []*omnibus.Message) ([]*driver.Delivery, error) {
	err := q.client.Publish(ctx, topic, msgs...)
	var pe *omnibus.PublishError
	switch {
	case err == nil:
		return ds, nil
	case !errors.As(err, &pe):
		return nil, err
	}
	failed := map[int]bool{}
	for _, f := range pe.Failed {
		failed[f.Index] = true
	}
	var landed []*driver.Delivery
	for i, d := range ds {
		if !failed[i] {
			landed = append(landed, d)
		}
	}
	return landed, err
}

// append publishes copies of ds, as they are but for their ID (see
// HeaderMovedID), to the dead-letter topic, and returns their IDs.
func (q *Queue) append(ctx context.Context, ds []*driver.Delivery) ([]string, error) {
	msgs := make([]*omnibus.Message, len(ds))
	ids := make([]string, len(ds))
	for i, d := range ds {
		h := maps.Clone(d.Headers)
		if h == nil {
			h = map[string]string{}
		}
		if h[HeaderMovedID] == "" {
			h[HeaderMovedID] = d.ID
		}
		ids[i] = omnibus.NewID()
		msgs[i] = &omnibus.Message{ID: ids[i], Key: d.Key, Type: d.Type, Source: d.Source, Time: d.Time,
			ContentType: d.ContentType, Headers: h, Body: d.Body}
	}
	return ids, q.client.Publish(ctx, q.topic, msgs...)
}

// check makes sure a replay to topic reaches someone: the topic exists
// (where the transport can tell), and on a broker, which keeps a message
// only for the groups that exist, the group that failed dl still reads
// it. Results are kept for the replay's duration.
func (r *run) check(ctx context.Context, topic string, dl *DeadLetter) error {
	group := ""
	if dl != nil && topic == dl.OriginTopic && !r.q.client.Capabilities().Replay {
		group = dl.OriginGroup
	}
	key := [2]string{topic, group}
	if err, ok := r.checked[key]; ok {
		return err
	}
	err := r.q.checkTarget(ctx, topic, group)
	r.checked[key] = err
	return err
}

func (q *Queue) checkTarget(ctx context.Context, topic, group string) error {
	ok, err := q.exists(ctx, topic)
	if err != nil {
		return fmt.Errorf("dlq: replay to %q: %w", topic, err)
	}
	if !ok {
		return fmt.Errorf("dlq: replay to %q: the topic does not exist; nothing was published there and the dead letters stay in %q: %w",
			topic, q.topic, omnibus.ErrNotFound)
	}
	if group == "" {
		return nil
	}
	if _, err := q.client.Lag(ctx, topic, group); errors.Is(err, omnibus.ErrNotFound) {
		return fmt.Errorf("dlq: replay to %q: group %q, which failed these messages, no longer reads the topic, and the transport keeps messages only for its groups; nothing was published and the dead letters stay in %q: %w",
			topic, group, q.topic, omnibus.ErrNotFound)
	}
	return nil
}
