package natsbus

// The group's durable consumers: their names and windows, a group's join
// (a consumer and a recorded position for every lane), their creation at
// a sequence and their re-creation when deleted behind the group's back,
// and pinning where the server has it. It runs on the goroutines of
// Subscribe, of a pump (re-creating a deleted consumer) and of the
// balancer (claiming a partition), and takes no lock: the state is the
// server's.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// maxAckPending is the consumer's MaxAckPending: the URL's, or 16 ×
// MaxInFlight.
func (s *sub) maxAckPending() int {
	if n := s.c.cfg.maxAckPending; n > 0 {
		return n
	}
	return 16 * s.opts.MaxInFlight
}

// DefaultEphemeralInactive is how long the server keeps the consumer of a
// throwaway group (one the user did not name) after its last member
// stopped pulling, when the URL sets no inactive_threshold. Members that
// leave normally delete it at once; this covers a crashed process.
const DefaultEphemeralInactive = 5 * time.Minute

// consumerName is the durable consumer of lane.
func (s *sub) consumerName(lane string) string {
	if s.ref.parts == 0 {
		return safeName(s.opts.Group)
	}
	p, _ := strconv.Atoi(lane)
	return partitionConsumer(s.opts.Group, p)
}

// join makes sure the group has a consumer and a recorded position for
// every lane. A new group (no consumer and no position anywhere) starts
// every lane at the same sequence: the stream's next (StartLatest) or its
// first (StartEarliest). A lane missing from a group that exists resumes
// at its recorded position, or, without one, at the stream's first
// message (redeliveries rather than a loss).
func (s *sub) join(ctx context.Context) error {
	exists := false
	var missing []string
	for _, lane := range s.lanes() {
		cons, err := s.c.js.Consumer(ctx, s.ref.name, s.consumerName(lane))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			if s.pos != nil {
				if _, _, ok, err := s.pos.get(ctx, lane); err != nil {
					return err
				} else if ok {
					exists = true
				}
			}
			missing = append(missing, lane)
			continue
		}
		if err != nil {
			return fmt.Errorf("consumer %q of stream %q: %w", s.consumerName(lane), s.ref.name, classify(err))
		}
		exists = true
		if next, ok := resumeSeq(cons.CachedInfo()); ok && s.pos != nil {
			if _, err := s.pos.init(ctx, lane, next); err != nil {
				return err
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	start := uint64(1)
	if !exists && s.opts.StartAt == driver.StartLatest {
		st, err := s.c.js.Stream(ctx, s.ref.name)
		if err != nil {
			return fmt.Errorf("stream %q: %w", s.ref.name, classify(err))
		}
		start = st.CachedInfo().State.LastSeq + 1
	}
	for _, lane := range missing {
		next := start
		if s.pos != nil {
			var err error
			if next, err = s.pos.init(ctx, lane, start); err != nil {
				return err
			}
		}
		if _, err := s.create(ctx, lane, next); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return err
		}
	}
	return nil
}

// consumer returns lane's consumer. When it is missing (deleted behind
// the group's back, or removed by inactive_threshold) it is created again
// at the lane's recorded position (at the stream's first message without
// one), never at the end of the stream. A throwaway group records no
// position: its missing consumer is an error wrapping ErrNotFound.
// An existing consumer's MaxAckPending is raised to the member's when
// lower.
func (s *sub) consumer(ctx context.Context, lane string) (jetstream.Consumer, error) {
	name := s.consumerName(lane)
	for try := 0; ; try++ {
		cons, err := s.c.js.Consumer(ctx, s.ref.name, name)
		if err == nil {
			cfg := cons.CachedInfo().Config
			if cfg.MaxAckPending >= s.maxAckPending() || cfg.MaxAckPending < 0 {
				return cons, nil
			}
			cfg.MaxAckPending = s.maxAckPending()
			if up, err := s.c.js.UpdateConsumer(ctx, s.ref.name, cfg); err == nil {
				return up, nil
			}
			return cons, nil // keep the smaller window rather than fail
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) || s.pos == nil {
			return nil, fmt.Errorf("consumer %q of stream %q: %w", name, s.ref.name, classify(err))
		}
		// The group's state deleted (DeleteGroup under a running member)
		// takes the positions bucket too.
		if err := s.pos.restore(ctx); err != nil {
			return nil, err
		}
		next, _, ok, err := s.pos.get(ctx, lane)
		if err != nil {
			return nil, err
		}
		if !ok {
			next = 1
		}
		cons, err = s.create(ctx, lane, next)
		if err == nil || !errors.Is(err, jetstream.ErrConsumerExists) || try >= 3 {
			return cons, err
		}
	}
}

// create creates lane's consumer starting at stream sequence next.
func (s *sub) create(ctx context.Context, lane string, next uint64) (jetstream.Consumer, error) {
	cc := jetstream.ConsumerConfig{
		Durable:           s.consumerName(lane),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       next,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           s.c.cfg.ackWait,
		MaxDeliver:        -1, // the engine counts attempts and dead-letters
		MaxAckPending:     s.maxAckPending(),
		InactiveThreshold: s.c.cfg.inactive,
	}
	if s.ref.parts > 0 {
		p, _ := strconv.Atoi(lane)
		cc.FilterSubject = partitionSubject(s.topic, p)
		s.c.pin(&cc)
	}
	if s.opts.Ephemeral {
		cc.Description = "omnibus throwaway group"
		if cc.InactiveThreshold == 0 {
			cc.InactiveThreshold = DefaultEphemeralInactive
		}
	}
	cons, err := s.c.js.CreateConsumer(ctx, s.ref.name, cc)
	if err != nil {
		return nil, fmt.Errorf("create consumer %q of stream %q at sequence %d: %w", cc.Durable, s.ref.name, next, classify(err))
	}
	return cons, nil
}

// pinGroup is the priority group of a pinned partition consumer.
const pinGroup = "omnibus"

// canPin reports whether the connected server has pinned-client priority
// groups (nats-server 2.11 and later).
func (c *conn) canPin() bool {
	v := strings.SplitN(strings.TrimPrefix(c.nc.ConnectedServerVersion(), "v"), ".", 3)
	if len(v) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(v[0])
	minor, err2 := strconv.Atoi(v[1])
	return err1 == nil && err2 == nil && (major > 2 || major == 2 && minor >= 11)
}

// pin makes cc a pinned-client consumer when the server has them: the
// server then serves the pulls of one client only, until it is unpinned
// or has pulled nothing for lease_ttl.
func (c *conn) pin(cc *jetstream.ConsumerConfig) {
	if c.canPin() {
		cc.PriorityPolicy, cc.PriorityGroups, cc.PinnedTTL = jetstream.PriorityPolicyPinned, []string{pinGroup}, c.cfg.leaseTTL
	}
}

// pinned reports whether a consumer serves a pinned client of pinGroup.
func pinned(info *jetstream.ConsumerInfo) bool {
	return info.Config.PriorityPolicy == jetstream.PriorityPolicyPinned && slices.Contains(info.Config.PriorityGroups, pinGroup)
}
