package bus

// Stats: what the bus counted (late, foreign and skipped messages), read
// with atomic loads from any goroutine.

import "sync/atomic"

// Stats are counters of an instance since New.
type Stats struct {
	Sent      int64 // commands sent (Send, Request)
	Published int64 // events published
	Replied   int64 // replies sent (Reply, and faults)
	Handled   int64 // messages whose handler returned nil
	Failed    int64 // messages whose handler returned an error (each attempt)
	Unhandled int64 // commands and replies without a handler, dead-lettered
	Undecoded int64 // messages that could not be decoded, dead-lettered
	Skipped   int64 // events of types the service has no handler for, settled unhandled
	Requests  int64 // Request calls
	Timeouts  int64 // Request calls that ended without a reply (ctx ended)
	Faults    int64 // Request calls answered with a fault
	// LateReplies counts replies to requests nobody waits for any more:
	// their Request ended (deadline) or was already answered (a command
	// handled twice replies twice). They are dropped.
	LateReplies int64
	// OtherReplies counts replies on the service's reply topic for its
	// other instances, which every instance reads and drops.
	OtherReplies int64
}

type stats struct {
	sent, published, replied, handled, failed, unhandled, undecoded, skipped,
	requests, timeouts, faults, late, other atomic.Int64
}

// Stats returns the instance's counters.
func (b *Bus) Stats() Stats {
	s := &b.stats
	return Stats{
		Sent: s.sent.Load(), Published: s.published.Load(), Replied: s.replied.Load(),
		Handled: s.handled.Load(), Failed: s.failed.Load(), Unhandled: s.unhandled.Load(),
		Undecoded: s.undecoded.Load(), Skipped: s.skipped.Load(), Requests: s.requests.Load(),
		Timeouts: s.timeouts.Load(), Faults: s.faults.Load(), LateReplies: s.late.Load(), OtherReplies: s.other.Load(),
	}
}
