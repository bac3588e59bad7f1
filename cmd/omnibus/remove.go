package main

// Removing what a command made on a server (bench's and demo's topics and
// groups, the raw baselines' streams), on contexts of its own so that a
// run that failed or was interrupted cleans up too, and naming what
// could not be removed. It runs on the command's goroutine.

import (
	"context"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus"
)

// groupOn is a consumer group on a topic.
type groupOn struct{ topic, group string }

// removeMade removes groups, then topics (a group's state can outlive its
// topic), through the transport's driver. What it cannot remove, because
// the transport has no way to or the removal failed, it names in left.
func removeMade(ctx context.Context, c *omnibus.Client, groups []groupOn, topics []string, left *leftovers) {
	r, ok := c.Driver().(topicDeleter)
	for _, g := range groups {
		what := "consumer group " + g.group
		if !ok {
			*left = append(*left, what)
			continue
		}
		left.remove(ctx, what, func(ctx context.Context) error { return r.DeleteGroup(ctx, g.topic, g.group) })
	}
	for _, t := range topics {
		what := "topic " + t
		if !ok {
			*left = append(*left, what)
			continue
		}
		left.remove(ctx, what, func(ctx context.Context) error { return r.DeleteTopic(ctx, t) })
	}
}

// removeTimeout bounds removing one thing a command made.
const removeTimeout = 30 * time.Second

// leftovers names what a command made on the transport and could not
// remove.
type leftovers []string

// remove calls rm on a context of its own, bounded by removeTimeout (ctx
// may be cancelled: the run failed, or was interrupted), and notes what
// it was to remove when it fails.
func (l *leftovers) remove(ctx context.Context, what string, rm func(context.Context) error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	if err := rm(rctx); err != nil {
		*l = append(*l, fmt.Sprintf("%s (removing it failed: %v)", what, err))
	}
}
