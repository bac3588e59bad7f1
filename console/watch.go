package console

// Watching one source: its connection (opened again after a failure),
// the lag samples of its groups with their history and the autoscaler's
// decisions, and its dead letters (counted at every sample, listed when
// the count changes, every DeadLetterInterval, and when asked). Each
// source has two goroutines, owned by Server.Run: the sampler (the
// connection and the lag) and the lister (dead letters, replays). The
// source's state is guarded by source.mu, which no I/O runs under.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/dlq"
)

// source is one watched transport.
type source struct {
	cfg    Source
	name   string // the URL without its password
	srv    *Server
	relist chan struct{} // asks the lister for a listing now

	mu      sync.Mutex
	client  *omnibus.Client
	status  string // "connecting", "ok", "unreachable"
	err     string
	retryAt time.Time
	caps    omnibus.Capabilities
	groups  []*group
	dead    []*deadTopic
	jobs    []*job
	nextJob int
	jobsWG  sync.WaitGroup // the jobs' goroutines
}

// group is one watched topic and group.
type group struct {
	topic, name string
	ctl         *autoscale.Controller

	// guarded by source.mu
	lanes    []laneView
	total    int64
	known    bool
	maxAge   *float64
	members  int
	err      string
	history  []point
	decision *decisionView
}

// listed is a dead letter as a listing keeps it: its body cut to
// keptBody, its size.
type listed struct {
	dl   *dlq.DeadLetter
	size int
}

// point is one sample in a group's history: the total lag and the
// oldest age, nil where unknown.
type point struct {
	At     time.Time
	Lag    *int64
	MaxAge *float64
}

// deadTopic is one watched dead-letter topic.
type deadTopic struct {
	topic string
	q     *dlq.Queue

	// guarded by source.mu
	count    *int64
	listed   []listed
	total    int64
	listedAt time.Time
	err      string
}

func (s *source) set(fn func()) {
	s.mu.Lock()
	fn()
	s.mu.Unlock()
	s.srv.changed()
}

// connect opens the source, again and again until it opens or ctx ends,
// waiting longer after each failure (1s doubling to 30s).
func (s *source) connect(ctx context.Context) (*omnibus.Client, error) {
	wait := time.Second
	for {
		s.set(func() {
			if s.status != "unreachable" { // an unreachable source stays so, with its error, while it is tried again
				s.status = "connecting"
			}
			s.retryAt = time.Time{}
		})
		octx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c, err := s.cfg.Open(octx)
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := s.srv.redact(s.cfg.URL, err)
		s.srv.log.Warn("console: source unreachable", "source", s.name, "err", msg, "retry_in", wait)
		s.set(func() { s.status, s.err, s.retryAt = "unreachable", msg, time.Now().Add(wait) })
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// run samples the source until ctx ends; the lister runs beside it.
func (s *source) run(ctx context.Context) {
	c, err := s.connect(ctx)
	if err != nil {
		return
	}
	defer func() { _ = c.Close() }()
	s.set(func() {
		s.client, s.status, s.err, s.caps = c, "ok", "", c.Capabilities()
		for _, g := range s.groups {
			g.ctl = s.srv.controller(c, g.topic, g.name)
		}
		for _, d := range s.dead {
			d.q, _ = dlq.New(c, d.topic)
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() { s.lister(ctx) })
	defer wg.Wait()
	tick := time.NewTicker(s.srv.o.Interval)
	defer tick.Stop()
	for {
		s.sample(ctx, c)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sample reads every group's lag and members, and every dead-letter
// topic's count, concurrently, each read bounded by the interval.
func (s *source) sample(ctx context.Context, c *omnibus.Client) {
	now := time.Now()
	rctx, cancel := context.WithTimeout(ctx, max(s.srv.o.Interval, 2*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for _, g := range s.groups {
		wg.Go(func() { s.sampleGroup(rctx, c, g, now) })
	}
	for _, d := range s.dead {
		wg.Go(func() {
			n, known, err := d.q.Count(rctx)
			s.set(func() {
				old := d.count
				switch {
				case err != nil:
					d.err, d.count = s.srv.redact(s.cfg.URL, err), nil
				case known:
					d.count = &n
				default:
					d.count = nil
				}
				if (old == nil) != (d.count == nil) || (old != nil && d.count != nil && *old != *d.count) {
					s.askList()
				}
			})
		})
	}
	wg.Wait()
	s.srv.changed()
}

func (s *source) sampleGroup(ctx context.Context, c *omnibus.Client, g *group, now time.Time) {
	lags, err := c.Lag(ctx, g.topic, g.name)
	members, merr := c.Members(ctx, g.topic, g.name)
	if merr != nil {
		members = -1
	}
	var owners map[string]string
	if s.cfg.Owners != nil && err == nil {
		owners, _ = s.cfg.Owners(ctx, c, g.topic, g.name)
	}
	var d *decisionView
	if g.ctl != nil {
		_ = g.ctl.Step(ctx)
		if last, ok, _ := g.ctl.Watch(); ok {
			d = newDecisionView(last)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g.decision = d
	p := point{At: now}
	if err != nil {
		g.err = s.srv.redact(s.cfg.URL, err)
		g.lanes, g.known, g.maxAge = nil, false, nil
	} else {
		g.err, g.members = "", members
		g.lanes = make([]laneView, len(lags))
		g.total, g.known, g.maxAge = 0, len(lags) > 0, nil
		for i, l := range lags {
			g.lanes[i] = newLaneView(l, owners[l.Lane], c.Capabilities().Ordered, members)
			if !l.Known {
				g.known = false
				continue
			}
			g.total += l.Lag
			if a := g.lanes[i].Age; a != nil && (g.maxAge == nil || *a > *g.maxAge) {
				g.maxAge = a
			}
		}
		if g.known {
			total := g.total
			p.Lag = &total
		}
		p.MaxAge = g.maxAge
	}
	g.history = append(g.history, p)
	cut := now.Add(-s.srv.o.History)
	i, _ := slices.BinarySearchFunc(g.history, cut, func(p point, t time.Time) int { return p.At.Compare(t) })
	g.history = slices.Delete(g.history, 0, i)
}

// askList asks the lister for a listing, unless one is asked for.
func (s *source) askList() {
	select {
	case s.relist <- struct{}{}:
	default:
	}
}

// lister lists the dead letters when asked and every
// DeadLetterInterval.
func (s *source) lister(ctx context.Context) {
	tick := time.NewTicker(s.srv.o.DeadLetterInterval)
	defer tick.Stop()
	for {
		for _, d := range s.dead {
			s.list(ctx, d)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.relist:
		case <-tick.C:
		}
	}
}

// listLimit is the most dead letters a listing keeps per topic, and
// keptBody the most bytes of each body it keeps (a view cuts further).
const (
	listLimit = 100
	keptBody  = 1 << 20
)

func (s *source) list(ctx context.Context, d *deadTopic) {
	l, err := d.q.List(ctx, dlq.ListOptions{Limit: listLimit, Wait: 5 * time.Second})
	if ctx.Err() != nil {
		return
	}
	s.set(func() {
		d.listedAt = time.Now()
		if err != nil {
			d.err = s.srv.redact(s.cfg.URL, err)
			return
		}
		d.err = ""
		d.listed = make([]listed, len(l.DeadLetters))
		for i, dl := range l.DeadLetters {
			d.listed[i] = listed{dl, len(dl.Body)}
			dl.Body = dl.Body[:min(len(dl.Body), keptBody)]
		}
		d.total = l.Total
		if l.Total < 0 {
			d.total = int64(len(l.DeadLetters))
		}
	})
}

// quiet discards the autoscaler's decision records: the page shows them.
var quiet = slog.New(slog.DiscardHandler)
