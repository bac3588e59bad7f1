package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/dlq"
)

// dlqOptions are the flags the dlq subcommands share.
type dlqOptions struct {
	url    string
	topic  string
	json   bool
	filter filterFlags
}

// filterFlags select dead letters.
type filterFlags struct {
	ids    []string
	reason string
	group  string
	key    string
	since  string
	until  string
	all    bool
}

func (a *app) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and delete dead letters",
		Long: `dlq works on a dead-letter topic: where a consumer of topic T puts the
messages it gave up on, T.dlq by default, with headers saying why (the
reason, the attempts, the origin topic, group, lane and position, and
the times of the first and last failures).

--topic names the consumer's topic (its dead letters are in T.dlq) or,
ending in .dlq, the dead-letter topic itself.

The tools read the dead-letter topic as the consumer group named after
it, and never disturb another group: list reads and settles nothing;
replay and delete settle what they replayed or deleted, so that the
topic keeps the dead letters they did not select (on a broker they are
acknowledged; on a log the group's position passes them, and dead
letters before the last selected one of a lane are appended again to
stay after it). Run one of them at a time per topic.

A replay publishes each selected dead letter again, once, to its origin
topic (or --to), as it was first published, under a new ID (the first
one's and -r1, -r2...) with headers omnibus-replayed-id,
omnibus-replayed-from, omnibus-replayed-at and omnibus-replays, then
removes it from the dead-letter topic. It checks first that the target
topic exists (and on RabbitMQ that the group that failed the message
still reads it, and publishes with mandatory=true, so that a message no
queue takes fails): nothing leaves the dead-letter topic that did not
land. It reports progress on standard error; Ctrl-C stops it after the
batch in flight.`,
		Example: `  omnibus dlq list --topic orders
  omnibus dlq list --topic orders --reason timeout --json
  omnibus dlq show --topic orders 3f1c9a2e-17
  omnibus dlq replay --topic orders --id 3f1c9a2e-17
  omnibus dlq replay --topic orders --all
  omnibus dlq replay --topic orders --group billing --since 1h --to orders-retry
  omnibus dlq delete --topic orders --key test-customer`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(a.dlqListCmd(), a.dlqShowCmd(), a.dlqReplayCmd(), a.dlqDeleteCmd())
	return cmd
}

// addDLQFlags adds the shared flags; withFilter adds the filters too.
func addDLQFlags(cmd *cobra.Command, o *dlqOptions, withFilter bool) {
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "the consumer's topic, or the dead-letter topic itself (ending in .dlq) (required)")
	f.BoolVar(&o.json, "json", false, "print JSON")
	if !withFilter {
		return
	}
	f.StringArrayVar(&o.filter.ids, "id", nil, "select the dead letter with this ID (repeat for more)")
	f.StringVar(&o.filter.reason, "reason", "", "select dead letters whose reason contains this text")
	f.StringVarP(&o.filter.group, "group", "g", "", "select dead letters of this consumer group")
	f.StringVar(&o.filter.key, "key", "", "select dead letters with this key")
	f.StringVar(&o.filter.since, "since", "", "select dead letters that last failed at or after this time (RFC 3339, or a duration ago: 1h)")
	f.StringVar(&o.filter.until, "until", "", "select dead letters that last failed before this time (RFC 3339, or a duration ago)")
}

// deadTopic is the dead-letter topic --topic names.
func deadTopic(topic string) string {
	if strings.HasSuffix(topic, ".dlq") {
		return topic
	}
	return topic + ".dlq"
}

// filter parses the filter flags.
func (f filterFlags) filter(now time.Time) (dlq.Filter, error) {
	out := dlq.Filter{IDs: f.ids, Reason: f.reason, Group: f.group, Key: f.key}
	var err error
	if out.Since, err = parseWhen("since", f.since, now); err != nil {
		return out, err
	}
	out.Until, err = parseWhen("until", f.until, now)
	return out, err
}

// parseWhen reads a time: RFC 3339, or a duration before now.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return t, usagef("dlq: --%s %q: want an RFC 3339 time or a duration ago (1h)", flag, s)
	}
	return t, nil
}

// openDLQ checks the flags and opens the dead letters of o.topic. RabbitMQ
// URLs are opened with mandatory=true unless they say otherwise, so that
// a replay to an exchange without queues fails rather than vanishes.
func (a *app) openDLQ(ctx context.Context, cmd string, o dlqOptions, opts ...omnibus.Option) (*dlq.Queue, func(), error) {
	if o.topic == "" {
		return nil, nil, usagef("dlq %s: --topic is required", cmd)
	}
	c, err := a.open(ctx, mandatoryURL(a.resolveURL(o.url)), opts...)
	if err != nil {
		return nil, nil, err
	}
	a.noteProcessLocal()
	q, err := dlq.New(c, deadTopic(o.topic))
	if err != nil {
		a.closeClient(c)
		return nil, nil, err
	}
	return q, func() { a.closeClient(c) }, nil
}

// mandatoryURL adds mandatory=true to an amqp:// or amqps:// URL that
// does not set it.
func mandatoryURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Query().Has("mandatory") {
		return raw
	}
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	return raw + sep + "mandatory=true"
}

func (a *app) dlqListCmd() *cobra.Command {
	var o dlqOptions
	var limit, maxBody int
	cmd := &cobra.Command{
		Use:   "list --topic T [filters] [--limit N] [--json]",
		Short: "List dead letters with why they failed",
		Long: `list prints the dead letters of a topic, oldest first per lane, with their
reason, attempts, origin group and lane@position, last failure and the
start of their body. It reads them without settling any: they stay.
--json prints one object per line (fields id, key, type, source, time,
headers, body, body_bytes, body_truncated, lane, position, reason,
attempts, topic, group, origin_lane, origin_position, first_failure,
last_failure), the body cut to --max-body bytes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usagef("dlq list: --limit %d: want 1 or more", limit)
			}
			f, err := o.filter.filter(time.Now())
			if err != nil {
				return err
			}
			q, done, err := a.openDLQ(cmd.Context(), "list", o)
			if err != nil {
				return err
			}
			defer done()
			l, err := q.List(cmd.Context(), dlq.ListOptions{Filter: f, Limit: limit})
			if err != nil {
				return err
			}
			if o.json {
				return printJSONLines(a.stdout, l.DeadLetters, maxBody)
			}
			printDeadLetters(a.stdout, q.Topic(), l)
			return nil
		},
	}
	addDLQFlags(cmd, &o, true)
	cmd.Flags().IntVar(&limit, "limit", 100, "list at most this many")
	cmd.Flags().IntVar(&maxBody, "max-body", 4096, "with --json, cut bodies to this many bytes (0: whole)")
	return cmd
}

func printJSONLines(w io.Writer, dls []*dlq.DeadLetter, maxBody int) error {
	enc := json.NewEncoder(w)
	for _, d := range dls {
		if err := enc.Encode(d.View(maxBody)); err != nil {
			return err
		}
	}
	return nil
}

// printDeadLetters prints a table of l, one line each.
func printDeadLetters(w io.Writer, topic string, l *dlq.Listing) {
	if len(l.DeadLetters) == 0 {
		fmt.Fprintf(w, "no dead letters in %s\n", topic)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFAILED\tATTEMPTS\tGROUP\tFROM\tREASON\tBODY")
	for _, d := range l.DeadLetters {
		failed := "?"
		if !d.LastFailure.IsZero() {
			failed = d.LastFailure.Local().Format(time.DateTime)
		}
		from := d.OriginTopic
		if d.OriginLane != "" {
			from += " " + d.OriginLane + "@" + d.OriginPosition
		}
		body, _, _ := dlq.FormatBody(d.Body, dlq.FormatText, 40)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, failed, d.Attempts, d.OriginGroup, from,
			cut(oneLine(d.Reason), 60), cut(oneLine(body), 40))
	}
	_ = tw.Flush()
	switch {
	case l.Total > int64(len(l.DeadLetters)):
		fmt.Fprintf(w, "%d shown of %d dead letters in %s\n", len(l.DeadLetters), l.Total, topic)
	default:
		fmt.Fprintf(w, "%d dead letters in %s\n", len(l.DeadLetters), topic)
	}
}

// cut shortens s to n runes, marking the cut.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (a *app) dlqShowCmd() *cobra.Command {
	var o dlqOptions
	var format string
	var maxBody int
	cmd := &cobra.Command{
		Use:   "show --topic T ID",
		Short: "Show one dead letter: its headers and body",
		Long: `show prints the dead letter with ID: what the engine recorded about its
failure, every header, and its body as --format says: auto (indented JSON
when the body is JSON, text when it is UTF-8, else hex), text, json or
hex, cut to --max-body bytes (0: whole). It settles nothing.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("dlq show: want one ID, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, _, err := dlq.FormatBody(nil, format, 0); err != nil {
				return usagef("dlq show: --format: %v", err)
			}
			q, done, err := a.openDLQ(cmd.Context(), "show", o)
			if err != nil {
				return err
			}
			defer done()
			l, err := q.List(cmd.Context(), dlq.ListOptions{Filter: dlq.Filter{IDs: args}, Limit: 10})
			if err != nil {
				return err
			}
			if len(l.DeadLetters) == 0 {
				return fmt.Errorf("dlq show: no dead letter %q in %s: %w", args[0], q.Topic(), omnibus.ErrNotFound)
			}
			if o.json {
				return printJSONLines(a.stdout, l.DeadLetters, maxBody)
			}
			for i, d := range l.DeadLetters {
				if i > 0 {
					fmt.Fprintln(a.stdout)
				}
				if err := printDeadLetter(a.stdout, d, format, maxBody); err != nil {
					return err
				}
			}
			return nil
		},
	}
	addDLQFlags(cmd, &o, false)
	cmd.Flags().StringVar(&format, "format", dlq.FormatAuto, "body format: auto, text, json or hex")
	cmd.Flags().IntVar(&maxBody, "max-body", 64<<10, "show at most this many bytes of the body (0: whole)")
	return cmd
}

// printDeadLetter prints one dead letter for people.
func printDeadLetter(w io.Writer, d *dlq.DeadLetter, format string, maxBody int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	when := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Local().Format(time.RFC3339Nano)
	}
	row("id", d.ID)
	row("reason", oneLine(d.Reason))
	row("attempts", fmt.Sprint(d.Attempts))
	row("topic", d.OriginTopic)
	row("group", d.OriginGroup)
	if d.OriginLane != "" {
		row("from", "lane "+d.OriginLane+" position "+d.OriginPosition)
	}
	row("first failure", when(d.FirstFailure))
	row("last failure", when(d.LastFailure))
	if d.Replays > 0 {
		row("replays", fmt.Sprint(d.Replays))
	}
	row("key", d.Key)
	row("type", d.Type)
	row("source", d.Source)
	row("time", when(d.Time))
	row("content type", d.ContentType)
	row("dead letter at", "lane "+d.Lane+" position "+d.Position)
	_ = tw.Flush()
	if len(d.Headers) > 0 {
		fmt.Fprintln(w, "headers:")
		for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
			fmt.Fprintf(w, "  %s: %s\n", k, d.Headers[k])
		}
	}
	body, truncated, err := dlq.FormatBody(d.Body, format, maxBody)
	if err != nil {
		body, truncated, _ = dlq.FormatBody(d.Body, dlq.FormatText, maxBody)
		fmt.Fprintf(w, "body (%d bytes; not JSON: %v; as text):\n", len(d.Body), err)
	} else {
		fmt.Fprintf(w, "body (%d bytes):\n", len(d.Body))
	}
	fmt.Fprint(w, body)
	if !strings.HasSuffix(body, "\n") {
		fmt.Fprintln(w)
	}
	if truncated {
		fmt.Fprintf(w, "(cut at %d of %d bytes; --max-body 0 shows it whole)\n", maxBody, len(d.Body))
	}
	return nil
}

func (a *app) dlqReplayCmd() *cobra.Command {
	var o dlqOptions
	var to string
	cmd := &cobra.Command{
		Use:   "replay --topic T (--id ID ... | filters | --all) [--to TOPIC]",
		Short: "Publish dead letters again and remove them from the dead-letter topic",
		Long: `replay publishes the selected dead letters again, each to the topic it
came from (or --to), and removes them from the dead-letter topic (see
omnibus dlq --help). Select them with --id, the filters, or --all. It
prints progress on standard error and a summary at the end (--json: one
object with read, selected, replayed, moved, no_topic, full, and
republished: messages published again after an error that left the
outcome unknown, each of which may arrive twice).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.dlqRun(cmd.Context(), "replay", o, to)
		},
	}
	addDLQFlags(cmd, &o, true)
	cmd.Flags().BoolVar(&o.filter.all, "all", false, "select every dead letter")
	cmd.Flags().StringVar(&to, "to", "", "publish to this topic (default: each dead letter's origin topic)")
	return cmd
}

func (a *app) dlqDeleteCmd() *cobra.Command {
	var o dlqOptions
	cmd := &cobra.Command{
		Use:   "delete --topic T (--id ID ... | filters | --all)",
		Short: "Remove dead letters without replaying them",
		Long: `delete removes the selected dead letters from the dead-letter topic
without publishing them anywhere. Select them with --id, the filters,
or --all.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.dlqRun(cmd.Context(), "delete", o, "")
		},
	}
	addDLQFlags(cmd, &o, true)
	cmd.Flags().BoolVar(&o.filter.all, "all", false, "select every dead letter")
	return cmd
}

// progressJSON is the --json shape of a replay's or a delete's result.
type progressJSON struct {
	Topic    string `json:"topic"`
	Read     int    `json:"read"`
	Selected int    `json:"selected"`
	Replayed int    `json:"replayed"`
	Deleted  int    `json:"deleted"`
	Moved    int    `json:"moved"`
	NoTopic  int    `json:"no_topic"`
	Full     bool   `json:"full"`
	// Republished counts messages published again after an error that
	// left their outcome unknown: each may have landed twice.
	Republished int64  `json:"republished,omitempty"`
	Stopped     bool   `json:"stopped,omitempty"`
	Error       string `json:"error,omitempty"`
}

// dlqRun replays (to to) or deletes the selected dead letters.
func (a *app) dlqRun(ctx context.Context, verb string, o dlqOptions, to string) error {
	f, err := o.filter.filter(time.Now())
	if err != nil {
		return err
	}
	if f.IsZero() && !o.filter.all {
		return usagef("dlq %s: say which dead letters: --id, --reason, --group, --key, --since, --until, or --all", verb)
	}
	if !f.IsZero() && o.filter.all {
		return usagef("dlq %s: --all selects every dead letter: give it without filters", verb)
	}
	var retried retryCount
	q, done, err := a.openDLQ(ctx, verb, o, omnibus.WithHooks(&retried))
	if err != nil {
		return err
	}
	defer done()
	rep := newProgressReporter(a.stderr, verb)
	bounds := dlq.Bounds{Progress: rep.report}
	var p dlq.Progress
	if verb == "replay" {
		p, err = q.Replay(ctx, dlq.ReplayOptions{Filter: f, To: to, Bounds: bounds})
	} else {
		p, err = q.Delete(ctx, dlq.DeleteOptions{Filter: f, Bounds: bounds})
	}
	rep.done()
	stopped := errors.Is(err, context.Canceled) && ctx.Err() != nil
	if o.json {
		out := progressJSON{Topic: q.Topic(), Read: p.Read, Selected: p.Selected, Replayed: p.Replayed, Deleted: p.Deleted,
			Moved: p.Moved, NoTopic: p.NoTopic, Full: p.Full, Stopped: stopped, Republished: retried.Load()}
		if err != nil && !stopped {
			out.Error = omnibus.Redact(err.Error(), a.rawURL)
		}
		b, _ := json.Marshal(out)
		fmt.Fprintf(a.stdout, "%s\n", b)
	} else {
		fmt.Fprintln(a.stdout, summary(verb, q.Topic(), p, retried.Load()))
	}
	switch {
	case stopped:
		fmt.Fprintf(a.stderr, "omnibus: %s stopped; the dead letters not %s stay in %s\n", verb, pastTense(verb), q.Topic())
		return errInterrupted
	case err != nil:
		return err
	}
	if p.Full {
		fmt.Fprintf(a.stderr, "omnibus: note: stopped reading after holding %d dead letters not selected; %s again, or narrow the selection, for the rest\n",
			dlq.DefaultWindow, verb)
	}
	return nil
}

func pastTense(verb string) string {
	if verb == "replay" {
		return "replayed"
	}
	return "deleted"
}

// summary is the one-line result of a replay or a delete, of which
// republished messages were published again after an error.
func summary(verb, topic string, p dlq.Progress, republished int64) string {
	var sb strings.Builder
	if verb == "replay" {
		fmt.Fprintf(&sb, "replayed %d", p.Replayed)
		if p.Deleted > 0 {
			fmt.Fprintf(&sb, " (and removed %d copies of those)", p.Deleted)
		}
	} else {
		fmt.Fprintf(&sb, "deleted %d", p.Deleted)
	}
	fmt.Fprintf(&sb, " of %d selected (%d read) from %s", p.Selected, p.Read, topic)
	if p.Moved > 0 {
		fmt.Fprintf(&sb, "; %d not selected appended again to stay after the group's position", p.Moved)
	}
	if p.NoTopic > 0 {
		fmt.Fprintf(&sb, "; %d left: they name no origin topic (give --to)", p.NoTopic)
	}
	if republished > 0 {
		fmt.Fprintf(&sb, "; %d published again after an error left the outcome unknown: each may arrive twice", republished)
	}
	return sb.String()
}

// progressReporter prints a replay's progress on stderr: at most twice a
// second, on one line that rewrites itself on a terminal.
type progressReporter struct {
	w    io.Writer
	verb string
	term bool

	mu      sync.Mutex
	last    time.Time
	printed bool
}

func newProgressReporter(w io.Writer, verb string) *progressReporter {
	return &progressReporter{w: w, verb: verb, term: isTerminal(w)}
}

func (r *progressReporter) report(p dlq.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.last) < 500*time.Millisecond {
		return
	}
	r.last = time.Now()
	n := p.Replayed
	if r.verb == "delete" {
		n = p.Deleted
	}
	line := fmt.Sprintf("%s: %d done, %d selected, %d read", r.verb, n, p.Selected, p.Read)
	if r.term {
		fmt.Fprintf(r.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(r.w, line)
	}
	r.printed = true
}

func (r *progressReporter) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.term && r.printed {
		fmt.Fprint(r.w, "\r\033[K")
	}
}
