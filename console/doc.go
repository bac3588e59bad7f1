// Package console serves a web page that shows, for one or several
// transports, the lag of consumer groups (per lane: the owner where the
// transport tells, the position, the lag in messages and in time, and a
// chart of the last minutes), the autoscaler's decisions for them, and
// the dead-letter topics with their messages, which it can replay or
// delete when allowed. The omnibus command's console subcommand runs it.
//
//	srv, _ := console.New(console.Options{Sources: []console.Source{{
//		URL: "kafka://localhost:9092", Topics: []string{"orders"}, Groups: []string{"billing"},
//	}}})
//	go srv.Run(ctx)
//	http.ListenAndServe("127.0.0.1:9480", srv.Handler())
//
// # What it reads
//
// Each source is sampled every Options.Interval: omnibus.Client.Lag and
// Members for every topic and group named (no transport lists them for
// omnibus), which read from outside the groups and take nothing from
// their members; the samples of the last Options.History are kept in
// memory for the chart. The autoscaler's decisions are computed by the
// console itself, by an autoscale.NewGroup controller per group with
// Options.Policy (it scales nothing): what a process running that policy
// would decide from the same lag. The dead-letter topics are counted at
// each sample (the lag of the dead-letter tools' group, see package dlq)
// and listed (up to 100 per topic) when the count changes, after a
// replay, and every Options.DeadLetterInterval; a listing reads the
// dead letters and settles none (see package dlq for its cost on each
// transport).
//
// A source that cannot be opened is shown as unreachable with the
// error, and opened again after 1 second, doubling to 30.
//
// # Live updates
//
// The page holds a server-sent event stream (/api/events), on which the
// server sends the whole state after each change, at most every 250 ms;
// the browser reconnects by itself when it breaks.
//
// # Safety
//
// The console changes nothing unless Options.AllowReplay; with it, the
// page can replay and delete dead letters (package dlq does it, with its
// checks: a target topic that does not exist is an error and nothing
// moves). Options.Token, when set, must come with each such call.
// A source's URL is shown, and its errors are logged and shown, without
// the password. Served on a loopback address, it answers only requests
// that name a loopback host, so that a site cannot reach it through a
// DNS name of its own, and the calls that change state take JSON from
// the page's own origin only.
//
// # Concurrency
//
// Run starts two goroutines per source, the sampler and the dead-letter
// lister, and one per replay or delete, and returns when ctx ends and
// all of them have. Handler may be served before Run starts; replays
// wait for it.
package console
