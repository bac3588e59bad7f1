package console

// The state as the page reads it (GET /api/state, and each server-sent
// event): JSON views built under the sources' locks. Pure functions
// besides snapshot.

import (
	"slices"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/dlq"
)

type stateView struct {
	Time          time.Time    `json:"time"`
	IntervalMs    int64        `json:"interval_ms"`
	AllowReplay   bool         `json:"allow_replay"`
	TokenRequired bool         `json:"token_required"`
	Policy        string       `json:"policy"`
	Sources       []sourceView `json:"sources"`
}

type sourceView struct {
	ID        int             `json:"id"`
	Name      string          `json:"name"`
	Transport string          `json:"transport"`
	Status    string          `json:"status"`
	Error     string          `json:"error,omitempty"`
	RetryAt   *time.Time      `json:"retry_at,omitempty"`
	Lag       string          `json:"lag_kind"`
	Ordered   bool            `json:"ordered"`
	Groups    []groupView     `json:"groups"`
	Dead      []deadTopicView `json:"dead_letters"`
	Jobs      []jobView       `json:"jobs"`
}

type groupView struct {
	Topic    string        `json:"topic"`
	Group    string        `json:"group"`
	Total    int64         `json:"total"`
	Known    bool          `json:"known"`
	MaxAge   *float64      `json:"max_age,omitempty"`
	Members  int           `json:"members"`
	Error    string        `json:"error,omitempty"`
	Lanes    []laneView    `json:"lanes"`
	History  [][3]any      `json:"history"` // [unix ms, lag or null, max age or null]
	Decision *decisionView `json:"decision,omitempty"`
}

type laneView struct {
	Lane      string   `json:"lane"`
	Lag       int64    `json:"lag"`
	Known     bool     `json:"known"`
	Age       *float64 `json:"age,omitempty"`
	Committed int64    `json:"committed"`
	Owner     string   `json:"owner"`
}

func newLaneView(l omnibus.LaneLag, owner string, ordered bool, members int) laneView {
	v := laneView{Lane: l.Lane, Lag: l.Lag, Known: l.Known, Committed: l.Committed, Owner: owner}
	if l.AgeKnown {
		a := l.Age.Seconds()
		v.Age = &a
	}
	switch {
	case v.Owner != "" || ordered || members < 0:
	case members == 0:
		v.Owner = "no member"
	default: // a competing-consumer queue: every member reads it
		v.Owner = "shared by all " + itoa(members) + " members"
	}
	return v
}

type decisionView struct {
	Time         time.Time `json:"time"`
	Action       string    `json:"action"`
	Current      int       `json:"current"`
	Desired      int       `json:"desired"`
	Reason       string    `json:"reason"`
	Lag          int64     `json:"lag"`
	Age          float64   `json:"age"`
	Cap          int       `json:"cap"`
	Stalled      []string  `json:"stalled"`
	Active       bool      `json:"active"`
	GroupMembers int       `json:"group_members"`
}

func newDecisionView(d autoscale.Decision) *decisionView {
	return &decisionView{Time: d.Time, Action: d.Action, Current: d.Current, Desired: d.Desired, Reason: d.Reason,
		Lag: d.Lag, Age: d.Age.Seconds(), Cap: d.Cap, Stalled: d.Stalled, Active: d.Active, GroupMembers: d.Members}
}

type deadTopicView struct {
	Topic    string     `json:"topic"`
	Count    *int64     `json:"count"` // the tools' group's lag; null when unknown
	Total    int64      `json:"total"` // what the last listing found
	ListedAt *time.Time `json:"listed_at,omitempty"`
	Error    string     `json:"error,omitempty"`
	Messages []dlq.View `json:"messages"`
}

// previewBytes is how much of each body the state carries; a message's
// own view (GET /api/deadletter) carries more.
const previewBytes = 160

func (s *source) view(id int) sourceView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := sourceView{ID: id, Name: s.name, Transport: scheme(s.cfg.URL), Status: s.status, Error: s.err,
		Lag: s.caps.Lag.String(), Ordered: s.caps.Ordered, Groups: []groupView{}, Dead: []deadTopicView{}, Jobs: []jobView{}}
	if at := s.retryAt; !at.IsZero() {
		v.RetryAt = &at
	}
	for _, g := range s.groups {
		gv := groupView{Topic: g.topic, Group: g.name, Total: g.total, Known: g.known, MaxAge: g.maxAge,
			Members: g.members, Error: g.err, Lanes: slices.Clone(g.lanes), Decision: g.decision}
		if gv.Lanes == nil {
			gv.Lanes = []laneView{}
		}
		gv.History = make([][3]any, len(g.history))
		for i, p := range g.history {
			gv.History[i] = [3]any{p.At.UnixMilli(), p.Lag, p.MaxAge}
		}
		v.Groups = append(v.Groups, gv)
	}
	for _, d := range s.dead {
		dv := deadTopicView{Topic: d.topic, Count: d.count, Total: d.total, Error: d.err, Messages: []dlq.View{}}
		if at := d.listedAt; !at.IsZero() {
			dv.ListedAt = &at
		}
		for _, l := range d.listed {
			mv := l.dl.View(previewBytes)
			mv.BodyBytes = l.size
			mv.BodyTruncated = mv.BodyTruncated || l.size > len(l.dl.Body)
			dv.Messages = append(dv.Messages, mv)
		}
		v.Dead = append(v.Dead, dv)
	}
	for _, j := range s.jobs {
		v.Jobs = append(v.Jobs, j.view())
	}
	return v
}

// snapshot is the whole state.
func (srv *Server) snapshot() stateView {
	st := stateView{Time: time.Now(), IntervalMs: srv.o.Interval.Milliseconds(), AllowReplay: srv.o.AllowReplay,
		TokenRequired: srv.o.Token != "", Policy: srv.policyText(), Sources: make([]sourceView, len(srv.sources))}
	for i, s := range srv.sources {
		st.Sources[i] = s.view(i)
	}
	return st
}
