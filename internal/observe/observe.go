// Package observe holds what the metrics packages (promomnibus,
// otelomnibus) share: the consumers a hook was bound to, read at
// collection time for their gauges (members, in flight, lag), and the
// one conversion of a lane's lag into the gauges' values.
package observe

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// LagTimeout bounds the lag reads of one collection: a transport that
// does not answer makes the lag unknown, not the scrape hang.
const LagTimeout = 5 * time.Second

// Lane is the lag of one lane as gauges report it.
type Lane struct {
	Lane string
	// Messages is the lane's lag in records or messages (what the
	// transport's lag counts; see driver.LagKind); MessagesKnown is false
	// when the transport could not tell, and then no value is reported.
	Messages      int64
	MessagesKnown bool
	// Seconds is how old the oldest unsettled message of the lane is;
	// SecondsKnown is false when the transport cannot tell.
	Seconds      float64
	SecondsKnown bool
}

// FromLag converts a lane's lag as the transport reports it: the count,
// and the age of the lane's oldest unsettled message where the transport
// tells it (driver.LaneLag.AgeKnown). A lag of kind LagMillis is a time,
// not a count: the count is then unknown. Every gauge, in process and in
// the exporter, reads a lane's lag through here.
func FromLag(l omnibus.LaneLag, kind driver.LagKind) Lane {
	return Lane{Lane: l.Lane, Messages: l.Lag, MessagesKnown: l.Known && kind != driver.LagMillis, Seconds: l.Age.Seconds(), SecondsKnown: l.AgeKnown}
}

// FromLags converts the lags of a transport whose lag is of kind.
func FromLags(lags []omnibus.LaneLag, kind driver.LagKind) []Lane {
	out := make([]Lane, len(lags))
	for i, l := range lags {
		out[i] = FromLag(l, kind)
	}
	return out
}

// Consumers is the set of consumers hooks were bound to and that have not
// stopped, each with what the hook keeps for it (its labels). It is safe
// for concurrent use.
type Consumers[T any] struct {
	mu   sync.Mutex
	list []Bound[T]
}

// Bound is a consumer and what a hook keeps for it.
type Bound[T any] struct {
	Consumer *omnibus.Consumer
	Value    T
}

// Add adds k with v; it leaves the set when it stops.
func (s *Consumers[T]) Add(k *omnibus.Consumer, v T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, Bound[T]{k, v})
}

// Live returns the consumers that have not stopped, and forgets the rest.
func (s *Consumers[T]) Live() []Bound[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = slices.DeleteFunc(s.list, func(b Bound[T]) bool { return stopped(b.Consumer) })
	return slices.Clone(s.list)
}

func stopped(k *omnibus.Consumer) bool {
	select {
	case <-k.Done():
		return true
	default:
		return false
	}
}

// Reading is one consumer read at collection time.
type Reading[T any] struct {
	Bound[T]
	Stats omnibus.Stats
	// Lanes is the lag per lane; nil when the transport reports no lag
	// or the read failed (LagErr).
	Lanes  []Lane
	LagErr error
}

// Read reads the stats and lag of each consumer, concurrently, each lag
// read bounded by LagTimeout. A consumer that stopped meanwhile is left
// out; one whose transport reports no lag has no Lanes and no error.
func Read[T any](ctx context.Context, bs []Bound[T]) []Reading[T] {
	out := make([]Reading[T], len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() {
			r := Reading[T]{Bound: b, Stats: b.Consumer.Stats()}
			if b.Consumer.Capabilities().Lag != driver.LagNone {
				lctx, cancel := context.WithTimeout(ctx, LagTimeout)
				lags, err := b.Consumer.Lag(lctx)
				cancel()
				if err != nil {
					r.LagErr = err
				} else {
					r.Lanes = FromLags(lags, b.Consumer.Capabilities().Lag)
				}
			}
			out[i] = r
		})
	}
	wg.Wait()
	return slices.DeleteFunc(out, func(r Reading[T]) bool {
		return errors.Is(r.LagErr, omnibus.ErrClosed) || stopped(r.Consumer)
	})
}
