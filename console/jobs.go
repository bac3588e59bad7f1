package console

// Replays and deletes started from the page: one goroutine each, owned
// by the source (Run waits for them), stopped by its cancel or when Run's
// context ends. A job's state is guarded by source.mu.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/dlq"
)

type job struct {
	id      int
	action  string // "replay" or "delete"
	topic   string
	to      string
	ids     []string
	started time.Time
	cancel  context.CancelFunc

	// guarded by source.mu
	state    string // "running", "done", "stopped", "failed"
	progress dlq.Progress
	err      string
	ended    time.Time
}

type jobView struct {
	ID       int          `json:"id"`
	Action   string       `json:"action"`
	Topic    string       `json:"topic"`
	To       string       `json:"to,omitempty"`
	Selected string       `json:"selected"`
	State    string       `json:"state"`
	Progress dlq.Progress `json:"progress"`
	Error    string       `json:"error,omitempty"`
	Started  time.Time    `json:"started"`
}

func (j *job) view() jobView {
	sel := "all"
	if len(j.ids) > 0 {
		sel = itoa(len(j.ids)) + " selected"
	}
	return jobView{ID: j.id, Action: j.action, Topic: j.topic, To: j.to, Selected: sel, State: j.state,
		Progress: j.progress, Error: j.err, Started: j.started}
}

// jobRequest is the body of POST /api/replay and /api/delete.
type jobRequest struct {
	Source int      `json:"source"`
	Topic  string   `json:"topic"`
	IDs    []string `json:"ids"`
	All    bool     `json:"all"`
	To     string   `json:"to"`
}

// errConflict: a job already runs on the topic.
var errConflict = errors.New("a replay or delete of this dead-letter topic is running")

// start starts a job on the source; ctx is Run's.
func (s *source) start(ctx context.Context, action string, r jobRequest) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d *deadTopic
	for _, x := range s.dead {
		if x.topic == r.Topic {
			d = x
		}
	}
	switch {
	case d == nil:
		return 0, fmt.Errorf("%q is not a dead-letter topic the console shows", r.Topic)
	case d.q == nil:
		return 0, fmt.Errorf("%s is not connected", s.name)
	case len(r.IDs) == 0 && !r.All:
		return 0, errors.New("say which dead letters: ids, or all")
	case len(r.IDs) > 0 && r.All:
		return 0, errors.New("ids and all exclude each other")
	}
	for _, j := range s.jobs {
		if j.topic == r.Topic && j.state == "running" {
			return 0, errConflict
		}
	}
	s.nextJob++
	jctx, cancel := context.WithCancel(ctx)
	j := &job{id: s.nextJob, action: action, topic: r.Topic, to: r.To, ids: r.IDs, started: time.Now(), cancel: cancel, state: "running"}
	s.jobs = append(s.jobs, j)
	if len(s.jobs) > 20 {
		s.jobs = s.jobs[len(s.jobs)-20:]
	}
	s.jobsWG.Go(func() { s.runJob(jctx, d.q, j) })
	return j.id, nil
}

func (s *source) runJob(ctx context.Context, q *dlq.Queue, j *job) {
	defer j.cancel()
	f := dlq.Filter{IDs: j.ids}
	b := dlq.Bounds{Progress: func(p dlq.Progress) { s.set(func() { j.progress = p }) }}
	var p dlq.Progress
	var err error
	if j.action == "replay" {
		p, err = q.Replay(ctx, dlq.ReplayOptions{Filter: f, To: j.to, Bounds: b})
	} else {
		p, err = q.Delete(ctx, dlq.DeleteOptions{Filter: f, Bounds: b})
	}
	s.set(func() {
		j.progress, j.ended = p, time.Now()
		switch {
		case errors.Is(err, context.Canceled):
			j.state = "stopped"
		case err != nil:
			j.state, j.err = "failed", s.srv.redact(s.cfg.URL, err)
		default:
			j.state = "done"
		}
	})
	s.srv.log.Info("console: "+j.action+" ended", "source", s.name, "topic", j.topic, "state", j.state,
		"replayed", p.Replayed, "deleted", p.Deleted, "err", err)
	s.askList()
}

// stop stops job id.
func (s *source) stop(id int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range s.jobs {
		if j.id == id && j.state == "running" {
			j.cancel()
			return true
		}
	}
	return false
}

func (s *source) waitJobs() { s.jobsWG.Wait() }
