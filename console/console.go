package console

// The Server: options, the sources, Run (the goroutines) and the
// notifications of change that the event streams wait on.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
)

// Source is one transport the console watches.
type Source struct {
	// URL names the source; the page shows it without its password.
	URL string
	// Open connects to the source. It is called again after a failure,
	// 1 second later, doubling to 30. Default: omnibus.Open on URL.
	Open func(ctx context.Context) (*omnibus.Client, error)
	// Topics and Groups are what the page shows: every group of Groups
	// on every topic of Topics (omnibus reads lag per topic and group;
	// no transport lists them for it).
	Topics []string
	Groups []string
	// DeadLetterTopics are the dead-letter topics shown. Default: each
	// topic followed by ".dlq".
	DeadLetterTopics []string
	// Owners, when set, reads who holds each lane of a group (a member's
	// name per lane), where the transport can tell.
	Owners func(ctx context.Context, c *omnibus.Client, topic, group string) (map[string]string, error)
}

// Options configure a Server.
type Options struct {
	Sources []Source
	// Interval is how often each source's lag is sampled. Default: 2s.
	Interval time.Duration
	// History is how far back the lag chart goes. Default: 10m.
	History time.Duration
	// DeadLetterInterval is how often the dead letters are listed again
	// when their count does not say they changed (a list reads them all;
	// see package dlq). Default: 30s.
	DeadLetterInterval time.Duration
	// AllowReplay lets the page replay and delete dead letters. Default:
	// false (the console changes nothing).
	AllowReplay bool
	// Token, when set, must come with every request that changes state,
	// as "Authorization: Bearer <token>".
	Token string
	// Policy is the autoscaling policy whose decisions the page shows for
	// each group, computed by the console from the group's lag (see
	// autoscale.NewGroup). Default: TargetLag 1000.
	Policy autoscale.Policy
	// Logger receives the console's warnings. Default: slog.Default().
	Logger *slog.Logger
}

// Server serves the console for its sources. Run samples them; Handler
// serves the page and its API.
type Server struct {
	o       Options
	log     *slog.Logger
	sources []*source

	mu      sync.Mutex
	version uint64
	wake    chan struct{}   // closed and replaced at each change
	ctx     context.Context // Run's, for the jobs; nil before Run
	closed  chan struct{}   // closed when Run returns: event streams end
}

// New checks o and returns a Server; nothing runs until Run.
func New(o Options) (*Server, error) {
	if len(o.Sources) == 0 {
		return nil, fmt.Errorf("console: no source: %w", omnibus.ErrInvalid)
	}
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.History <= 0 {
		o.History = 10 * time.Minute
	}
	if o.DeadLetterInterval <= 0 {
		o.DeadLetterInterval = 30 * time.Second
	}
	if o.Policy.TargetLag == 0 && o.Policy.TargetAge == 0 {
		o.Policy.TargetLag = 1000
	}
	o.Policy.Interval, o.Policy.Logger = o.Interval, quiet
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	srv := &Server{o: o, log: o.Logger, wake: make(chan struct{}), closed: make(chan struct{})}
	for i, sc := range o.Sources {
		if sc.URL == "" {
			return nil, fmt.Errorf("console: source %d has no URL: %w", i, omnibus.ErrInvalid)
		}
		if sc.Open == nil {
			raw := sc.URL
			sc.Open = func(ctx context.Context) (*omnibus.Client, error) { return omnibus.Open(ctx, raw) }
		}
		if sc.DeadLetterTopics == nil {
			for _, t := range sc.Topics {
				sc.DeadLetterTopics = append(sc.DeadLetterTopics, t+".dlq")
			}
		}
		s := &source{cfg: sc, name: omnibus.RedactURL(sc.URL), srv: srv, relist: make(chan struct{}, 1), status: "connecting"}
		for _, t := range sc.Topics {
			for _, g := range sc.Groups {
				s.groups = append(s.groups, &group{topic: t, name: g, members: -1})
			}
		}
		for _, t := range sc.DeadLetterTopics {
			s.dead = append(s.dead, &deadTopic{topic: t})
		}
		srv.sources = append(srv.sources, s)
	}
	return srv, nil
}

// Run watches the sources until ctx ends, then closes their clients and
// returns nil. It runs two goroutines per source (the sampler and the
// dead-letter lister) and one per replay, and waits for all of them;
// the event streams end with it. Call it once.
func (srv *Server) Run(ctx context.Context) error {
	srv.mu.Lock()
	srv.ctx = ctx
	srv.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range srv.sources {
		wg.Go(func() { s.run(ctx) })
	}
	wg.Wait()
	for _, s := range srv.sources {
		s.waitJobs()
	}
	close(srv.closed)
	return nil
}

// changed wakes the event streams.
func (srv *Server) changed() {
	srv.mu.Lock()
	srv.version++
	close(srv.wake)
	srv.wake = make(chan struct{})
	srv.mu.Unlock()
}

// watch returns the state's version and a channel closed at its next
// change.
func (srv *Server) watch() (uint64, <-chan struct{}) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.version, srv.wake
}

// redact is err's message without raw's password.
func (srv *Server) redact(raw string, err error) string {
	return omnibus.Redact(err.Error(), raw)
}

func (srv *Server) controller(c *omnibus.Client, topic, group string) *autoscale.Controller {
	ctl, err := autoscale.NewGroup(c, topic, group, srv.o.Policy)
	if errors.Is(err, omnibus.ErrUnsupported) { // TargetAge on a transport without ages
		p := srv.o.Policy
		p.TargetAge = 0
		if p.TargetLag == 0 {
			p.TargetLag = 1000
		}
		ctl, err = autoscale.NewGroup(c, topic, group, p)
	}
	if err != nil {
		srv.log.Warn("console: no autoscaler decisions", "topic", topic, "group", group, "err", err)
		return nil
	}
	return ctl
}

// policyText says what policy the decisions follow.
func (srv *Server) policyText() string {
	p := srv.o.Policy
	s := ""
	if p.TargetLag > 0 {
		s = "target lag " + strconv.FormatInt(p.TargetLag, 10) + " per member"
	}
	if p.TargetAge > 0 {
		if s != "" {
			s += ", "
		}
		s += "target age " + p.TargetAge.String()
	}
	return s
}

func scheme(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme
}

func itoa(n int) string { return strconv.Itoa(n) }
