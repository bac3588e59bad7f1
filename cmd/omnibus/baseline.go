package main

import (
	"context"

	"github.com/omnibus-go/omnibus"
)

// baseline runs bench's work through a transport's own client on the same
// server, in the same run, so bench can print omnibus's cost as a ratio.
type baseline struct {
	// client names the raw client, e.g. "nats.go/jetstream".
	client string
	// run publishes o.count messages of o.size bytes to topic and consumes
	// them, and returns both rates in messages per second. It removes
	// what it made on the server, however it ends, through left, which
	// names what it could not remove. c is the omnibus client bench used,
	// for transports whose server lives inside it (an embedded server) or
	// whose client cannot remove what it made; rawURL is the URL it was
	// opened with.
	run func(ctx context.Context, c *omnibus.Client, rawURL, topic string, o benchOptions, left *leftovers) (publish, consume float64, err error)
}

// baselines holds the raw-client baselines by URL scheme. A transport adds
// its own from an init function in a file of its own (baseline_<x>.go).
var baselines = map[string]baseline{}

// noBaseline says why a scheme has no baseline, where there is a reason.
var noBaseline = map[string]string{
	"mem": "membus is omnibus's own in-memory log; it has no client of its own",
}
