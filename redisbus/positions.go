package redisbus

// Positions: where each group resumes on each stream, recorded outside
// the group (a hash per topic), so that a group deleted behind its
// members' backs (XGROUP DESTROY by an operator or a script) is created
// again where it was, never at the end of the stream. Members join at
// the record, write it when they join, every claim_idle/4
// (unpartitioned) or lease_ttl/4 (partitioned, for the lanes they hold),
// when they hand a lane over and when they leave; a member whose read
// finds the group missing creates it again at the record. It runs on
// the caller's goroutine and on the member's goroutines; it keeps no
// state of its own.

import (
	"context"
	"fmt"
)

// join creates group on stream where it does not exist: at its recorded
// position, else at start ("$" the end, "0" the first entry), with no
// run counts (see CountRun).
func (c *conn) join(ctx context.Context, topic, stream, field, group, start string) error {
	err := joinScript.Run(ctx, c.rdb, []string{stream, positionsKey(topic), runsKey(stream, group)}, group, field, start).Err()
	if err != nil {
		return fmt.Errorf("create group on stream %q: %w", stream, classify(err))
	}
	return nil
}

// field is the positions field of lane l of the member's group.
func (s *sub) field(l *lane) string { return positionField(s.group, l.id, s.parts > 0) }

// record writes where the group resumes on lane l's stream.
func (s *sub) record(ctx context.Context, l *lane) {
	err := recordScript.Run(ctx, s.c.rdb, []string{l.stream, positionsKey(s.topic)}, s.group, s.field(l)).Err()
	if err != nil && !isNil(err) && s.ctx.Err() == nil {
		s.c.log.Warn("recording the group's position failed", "stream", l.stream, "group", s.group, "err", err)
	}
}

// rejoin creates the group again on the streams of lanes after a read
// found it missing, at its recorded position (or at the stream's first
// entry: redeliveries, never a skip), and logs that it did.
func (s *sub) rejoin(lanes []*lane, cause error) error {
	for _, l := range lanes {
		if err := s.c.join(s.ctx, s.topic, l.stream, s.field(l), s.group, "0"); err != nil {
			return fmt.Errorf("redisbus: group %q on stream %q: %w", s.group, l.stream, err)
		}
		l.cursor, l.last = "", ""
		if s.parts > 0 {
			l.cursor = "0-0"
		}
	}
	s.c.log.Warn("the group was missing; created again at its recorded position", "topic", s.topic, "group", s.group, "err", cause)
	return nil
}
