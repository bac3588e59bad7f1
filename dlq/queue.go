package dlq

// Queue: the dead letters of one dead-letter topic, counted (from the
// group's lag), listed and viewed (a session that settles nothing).
// Queue.mu serializes the sessions of one Queue.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Group is the consumer group the dead-letter tools read topic as: the
// group named after the topic. Its position is what the tools have
// replayed (or, on a broker, its queue is what is left).
func Group(topic string) string { return topic }

// Queue is the dead letters of one dead-letter topic. Its methods may be
// called concurrently; they run one at a time, since two readings of the
// same group would take lanes (or messages) from each other.
type Queue struct {
	client *omnibus.Client
	topic  string
	mu     sync.Mutex
}

// New returns the dead letters of topic (by default a consumer's topic
// followed by ".dlq") on c. It does no I/O.
func New(c *omnibus.Client, topic string) (*Queue, error) {
	if c == nil || topic == "" {
		return nil, fmt.Errorf("dlq: a client and a dead-letter topic are needed: %w", omnibus.ErrInvalid)
	}
	return &Queue{client: c, topic: topic}, nil
}

// Topic returns the dead-letter topic.
func (q *Queue) Topic() string { return q.topic }

// topicExister is implemented by a transport connection that can tell
// whether a topic exists without creating it.
type topicExister interface {
	TopicExists(ctx context.Context, topic string) (bool, error)
}

// exists reports whether topic exists, where the transport tells; true
// where it cannot.
func (q *Queue) exists(ctx context.Context, topic string) (bool, error) {
	te, ok := q.client.Driver().(topicExister)
	if !ok {
		return true, nil
	}
	ok, err := te.TopicExists(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("dlq: topic %q: %w", topic, err)
	}
	return ok, nil
}

// Count reports how many dead letters are left: the lag of the tools'
// group, read without joining it. known is false where the transport
// cannot tell, or the group has not read the topic yet (a log's group
// exists once it has read). It costs one lag read.
func (q *Queue) Count(ctx context.Context) (n int64, known bool, err error) {
	if k := q.client.Capabilities().Lag; k != driver.LagRecords && k != driver.LagDepth {
		return 0, false, nil // a lag in time is no count
	}
	lags, err := q.client.Lag(ctx, q.topic, Group(q.topic))
	if errors.Is(err, omnibus.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	n, known = total(lags, nil)
	return n, known, nil
}

// ListOptions bound a List.
type ListOptions struct {
	// Filter selects the dead letters listed. Default: all.
	Filter Filter
	// Limit is the most dead letters returned. Default: 100.
	Limit int
	// Scan is the most dead letters read to find them. Default: 10000.
	Scan int
	// Wait is the longest a read waits for a message the transport says
	// is there (one another reader holds, say). Default: 10s.
	Wait time.Duration
}

// Listing is what List found.
type Listing struct {
	DeadLetters []*DeadLetter
	// Read counts the dead letters read, matching or not.
	Read int
	// Total is how many dead letters are left in all, from the group's
	// lag as the reading ended; -1 where the transport cannot tell.
	Total int64
}

// List reads the dead letters left and returns those the filter selects,
// oldest first per lane, each ID once. It settles nothing: brokers get the messages
// back unacknowledged when it ends (with their redelivered flag set),
// logs are not committed. A topic that does not exist is an error
// wrapping ErrNotFound.
func (q *Queue) List(ctx context.Context, o ListOptions) (*Listing, error) {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	if o.Scan <= 0 {
		o.Scan = 10000
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	s, err := q.open(ctx, sessionOptions{window: o.Scan, bytes: 1 << 30, wait: o.Wait})
	if err != nil {
		return nil, err
	}
	defer s.close()
	out := &Listing{DeadLetters: []*DeadLetter{}}
	seen := map[string]bool{} // a broker may deliver a message again (a channel reopened): list it once
	for len(out.DeadLetters) < o.Limit {
		ds, err := s.next(ctx, pollEvery)
		if errors.Is(err, errFull) {
			break
		}
		if err != nil {
			return nil, err
		}
		if ds == nil {
			break
		}
		for _, d := range ds {
			out.Read++
			if dl := parse(d); !seen[dl.ID] && o.Filter.Match(dl) && len(out.DeadLetters) < o.Limit {
				seen[dl.ID] = true
				out.DeadLetters = append(out.DeadLetters, dl)
			}
			d.Body = nil // held for nothing but its place
		}
	}
	out.Total = s.left(ctx)
	return out, nil
}

// pollEvery is how often a read that waits checks the group's lag.
const pollEvery = 200 * time.Millisecond

// open checks that the topic exists and starts a session.
func (q *Queue) open(ctx context.Context, o sessionOptions) (*session, error) {
	ok, err := q.exists(ctx, q.topic)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("dlq: dead-letter topic %q does not exist (nothing was dead-lettered there, or the name is wrong): %w", q.topic, omnibus.ErrNotFound)
	}
	if o.wait <= 0 {
		o.wait = 10 * time.Second
	}
	o.idle = time.Second
	return openSession(ctx, q.client.Driver(), q.topic, o)
}

// check for the compiler: a session is the driver's Lanes.
var _ driver.Lanes = (*session)(nil)
