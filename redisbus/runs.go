package redisbus

// Run counts: how many holders ran each redelivered entry of a group,
// kept beside the group in a hash per stream (runsKey), so that a
// message a crashed member held and never ran is not dead-lettered with
// the one that crashed it. CountRun runs on the engine's worker; Ack
// deletes the records (receive.go), a new group starts without any
// (joinScript), and a throwaway group's are deleted with it. It keeps no
// state of its own.

import (
	"context"
	"fmt"

	"github.com/omnibus-go/omnibus/driver"
)

// CountRun implements driver.RunCounter. An entry's Attempt is its
// delivery count in the group, which every claim raises (XAUTOCLAIM,
// XCLAIM): that of a member that died holding it behind the poisoned
// entry, without running it, and that of a lane's next owner taking over
// what a crashed owner left pending. Such an entry would reach
// MaxAttempts with the poisoned one. So the group counts the holders
// that ran a redelivered entry, in the hash "<stream>:runs:<group>"
// (field: the entry ID), by runScript, atomically: the first record
// counts 2 (the entry's first holder, unrecorded, and this one), each
// later holder one more. Ack deletes the record.
//
// A record also keeps the delivery count it was written at, which only
// rises while the entry is pending: a record of a higher count is not
// this entry's (a group or stream of the same name before, whose entry
// IDs can come again) and counting starts over; and a group redisbus
// creates starts with no records.
func (s *sub) CountRun(ctx context.Context, d *driver.Delivery) (int, error) {
	l, ok := d.Token.(*lane)
	if !ok {
		return 0, fmt.Errorf("redisbus: count runs on %q: delivery of lane %q is not from redisbus: %w", s.topic, d.Lane, driver.ErrInvalid)
	}
	n, err := runScript.Run(ctx, s.c.rdb, []string{l.stream, runsKey(l.stream, s.group)}, s.group, d.Position).Int()
	if err != nil {
		return 0, fmt.Errorf("redisbus: count runs of entry %s on stream %q group %q: %w", d.Position, l.stream, s.group, classify(err))
	}
	return n, nil
}
