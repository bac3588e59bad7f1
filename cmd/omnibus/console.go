package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/console"
)

type consoleOptions struct {
	urls        []string
	topics      []string
	groups      []string
	deadTopics  []string
	addr        string
	allowReplay bool
	token       string
	interval    time.Duration
	history     time.Duration
	targetLag   int64
	targetAge   time.Duration
}

func (a *app) consoleCmd() *cobra.Command {
	var o consoleOptions
	cmd := &cobra.Command{
		Use:   "console --topic T --group G [--url URL ...] [--addr HOST:PORT] [--allow-replay [--token TOKEN]]",
		Short: "Serve a web page of lag, lanes, autoscaler decisions and dead letters",
		Long: `console serves a web page, at http://127.0.0.1:9480 by default, that
shows for each --url (repeat it for several transports) every --group
on every --topic: the lag in messages and in time, per lane with its
owner (where the transport tells) and position, a chart of the last
minutes, the members, and the autoscaler's decision for the group
(computed by the console from the lag, with --target-lag and
--target-age: what a process running that policy would do); and the
dead-letter topics (T.dlq for each topic, or --dead-letter-topic) with
their messages: why each failed, its headers, and its body as text,
indented JSON or hex. The page updates itself live (server-sent
events). A URL that cannot be reached is shown as such and tried again.

The console reads without joining the groups, and lists dead letters
without settling them (see omnibus dlq --help). It changes nothing
unless started with --allow-replay, which lets the page replay and
delete dead letters; --token then protects those calls (the page asks
for it). It listens on loopback unless --addr says otherwise, and never
shows a URL's password.`,
		Example: `  omnibus console --topic orders --group billing
  omnibus console --url kafka://localhost:9092 --url amqp://guest:guest@localhost:5672/ --topic orders --group billing --group audit
  omnibus console --topic orders --group billing --allow-replay --token "$(openssl rand -hex 16)"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.console(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.urls, "url", nil, "transport URL (repeat for several; default $OMNIBUS_URL, else the embedded default)")
	f.StringArrayVarP(&o.topics, "topic", "t", nil, "topic to show (required; repeat for more)")
	f.StringArrayVarP(&o.groups, "group", "g", nil, "consumer group to show on each topic (repeat for more)")
	f.StringArrayVar(&o.deadTopics, "dead-letter-topic", nil, "dead-letter topic to show (repeat; default: T.dlq for each topic)")
	f.StringVar(&o.addr, "addr", "127.0.0.1:9480", "address to serve the page on (host:port; port 0 picks one)")
	f.BoolVar(&o.allowReplay, "allow-replay", false, "let the page replay and delete dead letters")
	f.StringVar(&o.token, "token", "", "with --allow-replay: a token the page must give to replay or delete")
	f.DurationVar(&o.interval, "interval", 2*time.Second, "time between lag samples")
	f.DurationVar(&o.history, "history", 10*time.Minute, "how far back the lag chart goes")
	f.Int64Var(&o.targetLag, "target-lag", 1000, "the autoscaler decisions' target lag per member (0: none)")
	f.DurationVar(&o.targetAge, "target-age", 0, "the autoscaler decisions' target age of the oldest message (0: none)")
	return cmd
}

func (a *app) console(ctx context.Context, o consoleOptions) error {
	switch {
	case len(o.topics) == 0:
		return usagef("console: --topic is required (omnibus reads lag per topic and group; no transport lists them for it)")
	case o.token != "" && !o.allowReplay:
		return usagef("console: --token protects replays: give --allow-replay too")
	case o.interval <= 0 || o.history <= 0:
		return usagef("console: --interval and --history must be positive")
	case o.targetLag < 0 || o.targetAge < 0 || (o.targetLag == 0 && o.targetAge == 0):
		return usagef("console: set --target-lag, --target-age or both, not negative")
	}
	if len(o.urls) == 0 {
		o.urls = []string{a.resolveURL("")}
	}
	var sources []console.Source
	for _, raw := range o.urls {
		raw := mandatoryURL(raw) // a replay to an exchange without queues fails, rather than vanishes
		sources = append(sources, console.Source{
			URL: raw, Topics: o.topics, Groups: o.groups, DeadLetterTopics: o.deadTopics,
			Open: func(ctx context.Context) (*omnibus.Client, error) {
				// a.open says what speaks on a port when it is not the transport.
				return (&app{stderr: a.stderr, getenv: a.getenv}).open(ctx, raw)
			},
			Owners: ownersOf(raw),
		})
	}
	srv, err := console.New(console.Options{Sources: sources, Interval: o.interval, History: o.history,
		AllowReplay: o.allowReplay, Token: o.token, Policy: autoscale.Policy{TargetLag: o.targetLag, TargetAge: o.targetAge}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("console: --addr %s: %w", o.addr, err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }() // ends with Shutdown below
	mode := "read-only"
	if o.allowReplay {
		mode = "replay allowed"
		if o.token != "" {
			mode += ", with a token"
		}
	}
	if !isLoopback(ln.Addr()) {
		fmt.Fprintf(a.stderr, "omnibus: note: the console listens on %s, beyond this machine\n", ln.Addr())
	}
	fmt.Fprintf(a.stdout, "console at http://%s/ (%s); Ctrl-C stops\n", ln.Addr(), mode)
	runErr := srv.Run(ctx) // until Ctrl-C
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx) // event streams end with the listener's connections
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}

func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// ownersFunc reads who holds each lane of a group.
type ownersFunc = func(ctx context.Context, c *omnibus.Client, topic, group string) (map[string]string, error)

// laneOwners make, per URL scheme, an ownersFunc for a URL, where the
// transport can tell (files lag_<x>.go add theirs).
var laneOwners = map[string]func(raw string) ownersFunc{}

func ownersOf(raw string) ownersFunc {
	if mk, ok := laneOwners[scheme(raw)]; ok {
		return mk(raw)
	}
	return nil
}
