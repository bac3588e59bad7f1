// Command omnibus sends, tails, measures and demonstrates messaging through
// omnibus on any transport named by URL.
//
// Usage:
//
//	omnibus demo                                  # the whole idea in 15 seconds
//	omnibus send --topic orders < orders.txt      # one message per line
//	omnibus tail --topic orders --json            # print messages as they arrive
//	omnibus lag --topic orders --group billing    # lag and status per lane
//	omnibus exporter --topic orders --group billing  # lag for Prometheus, at :9464/metrics
//	omnibus dlq list --topic orders               # dead letters and why they failed
//	omnibus dlq replay --topic orders --all       # publish them again, remove them
//	omnibus console --topic orders --group billing  # a web page of lag, lanes and dead letters
//	omnibus bench --count 20000 --size 1024       # throughput and latency
//	omnibus server                                # run the embedded default in the foreground
//	omnibus version
//
// Every command takes --url; OMNIBUS_URL is its default, and with neither
// the command uses the embedded default transport, so nothing needs to be
// installed: a NATS JetStream server inside the process that keeps its
// data in the per-user data directory ($XDG_DATA_HOME/omnibus/nats, or
// ~/.local/share/omnibus/nats), so what one command sends, the next one
// reads. While one command runs that server, the others connect to it.
// Transports are linked in by transports.go.
//
// # Exit codes
//
//	0    success
//	1    the command failed (one line on standard error says why)
//	2    bad usage: an unknown command or flag, a missing or invalid value
//	130  interrupted (Ctrl-C) during send, bench or demo
//
// Error messages never show a URL's password.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(runMain(os.Args[1:])) }

// runMain runs the command line args as the omnibus process does and
// returns its exit code.
func runMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default behaviour so a second
	// Ctrl-C kills a process that is slow to drain.
	context.AfterFunc(ctx, stop)
	code := run(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	return code
}
