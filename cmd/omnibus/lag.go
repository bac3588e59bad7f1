package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/spf13/cobra"
)

type lagOptions struct {
	url      string
	topic    string
	group    string
	json     bool
	watch    bool
	interval time.Duration
	samples  int
	window   int
}

func (a *app) lagCmd() *cobra.Command {
	var o lagOptions
	cmd := &cobra.Command{
		Use:   "lag --topic T --group G [--json] [--watch]",
		Short: "Show a consumer group's lag per lane, with a status per lane",
		Long: `lag reads a consumer group's lag per lane and in total, without joining the
group, and judges each lane from a sliding window of samples:

  OK       caught up within the window, or the lag is falling
  EARLY    lag, and one sample is too few to judge it (the first --watch report)
  WARN     the lag grows while offsets move: consumers alive but falling behind
  STALL    lag and no progress while the group has members (a stuck message)
  STOP     lag and the group stopped committing (no members left)
  UNKNOWN  the lag could not be read (never shown as zero)

AGE is how long the oldest unsettled message of the lane has waited, where
the transport can tell ("?" where it cannot: RabbitMQ shows the head of a
queue to no one but the consumer holding it); the total's is the oldest.
LAG counts messages, except on Kinesis, which has no offsets to count
records by: there it is the time behind in milliseconds, headed LAG(ms),
and the total is the largest lane's.

Without --watch it takes --samples samples --interval apart and prints
once; with --watch it prints after every sample until Ctrl-C. The
transport must be able to read a group's lag from outside the group.`,
		Example: `  omnibus lag --topic orders --group billing
  omnibus lag --topic orders --group billing --json
  omnibus lag --url kafka://localhost:9092 --topic orders --group billing --watch --interval 5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.lag(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic (required)")
	f.StringVarP(&o.group, "group", "g", "", "consumer group (required)")
	f.BoolVar(&o.json, "json", false, "print one JSON object per report")
	f.BoolVar(&o.watch, "watch", false, "keep sampling and printing until Ctrl-C")
	f.DurationVar(&o.interval, "interval", time.Second, "time between samples")
	f.IntVar(&o.samples, "samples", 3, "samples to take before printing, without --watch")
	f.IntVar(&o.window, "window", 5, "samples in the sliding window that judges the status")
	return cmd
}

// groupLag is one reading of a group's lag from outside the group.
type groupLag struct {
	Lanes []driver.LaneLag
	// Committed is the group's committed position per lane, where the
	// source knows it (nil otherwise).
	Committed map[string]int64
	// Members is the number of group members, -1 when unknown.
	Members int
	// Millis tells that the lag is a time in milliseconds (a transport
	// of driver.LagMillis, Kinesis), not a count of messages.
	Millis bool
}

// lagSource reads a group's lag.
type lagSource func(ctx context.Context, topic, group string) (groupLag, error)

// lagSources open a lag source for a URL scheme whose driver does not
// tell all of a group's lag itself (c is the client opened on rawURL);
// close releases it. Files lag_<x>.go add theirs.
var lagSources = map[string]func(ctx context.Context, c *omnibus.Client, rawURL string) (src lagSource, close func(), err error){}

// lagSample is one reading of the group's lag.
type lagSample struct {
	At time.Time
	groupLag
	Err error
}

// lagReport is the --json shape of a report.
type lagReport struct {
	Topic string       `json:"topic"`
	Group string       `json:"group"`
	Time  time.Time    `json:"time"`
	Lanes []laneReport `json:"lanes"`
	Total int64        `json:"total"`
	// Unit is "ms" where the lag is a time in milliseconds (Kinesis: no
	// count of records can be had); the total is then the largest lane's.
	Unit    string     `json:"unit,omitempty"`
	MaxAge  *float64   `json:"max_age_seconds,omitempty"`
	Unknown int        `json:"unknown_lanes,omitempty"`
	Status  laneStatus `json:"status"`
	Error   string     `json:"error,omitempty"`
}

type laneReport struct {
	Lane  string `json:"lane"`
	Lag   int64  `json:"lag"`
	Known bool   `json:"known"`
	// Age is how long the lane's oldest unsettled message has waited, in
	// seconds; absent when the transport cannot tell.
	Age    *float64   `json:"age_seconds,omitempty"`
	Status laneStatus `json:"status"`
}

func (a *app) lag(ctx context.Context, o lagOptions) error {
	switch {
	case o.topic == "":
		return usagef("lag: --topic is required")
	case o.group == "":
		return usagef("lag: --group is required")
	case o.interval <= 0:
		return usagef("lag: --interval %v: want a positive duration", o.interval)
	case o.samples < 1 || o.window < 1:
		return usagef("lag: --samples and --window must be at least 1")
	}
	src, closeSrc, err := a.openLag(ctx, o.url)
	if err != nil {
		return err
	}
	defer closeSrc()
	read := func() lagSample {
		s := lagSample{At: time.Now()}
		s.groupLag, s.Err = src(ctx, o.topic, o.group)
		return s
	}
	return runLag(ctx, a.stdout, o, read)
}

// openLag opens the transport named by url and finds how to read a
// group's lag on it (lagSource); close releases both.
func (a *app) openLag(ctx context.Context, url string) (src lagSource, close func(), err error) {
	c, err := a.open(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	a.noteProcessLocal()
	src, closeSrc, err := a.lagSource(ctx, c)
	if err != nil {
		a.closeClient(c)
		return nil, nil, err
	}
	return src, func() { closeSrc(); a.closeClient(c) }, nil
}

// lagSource finds how to read a group's lag on c's transport: a source
// for the scheme that also reads committed positions and members (Kafka),
// else the driver's own group lag reader, else an error.
func (a *app) lagSource(ctx context.Context, c *omnibus.Client) (lagSource, func(), error) {
	if open, ok := lagSources[scheme(a.rawURL)]; ok {
		return open(ctx, c, a.rawURL)
	}
	if glr, ok := c.Driver().(driver.GroupLagReader); ok {
		gmr, _ := c.Driver().(driver.GroupMembersReader)
		millis := c.Capabilities().Lag == driver.LagMillis
		return func(ctx context.Context, topic, group string) (groupLag, error) {
			g := groupLag{Members: -1, Millis: millis}
			var err error
			if g.Lanes, err = glr.GroupLag(ctx, topic, group); err != nil {
				return g, err
			}
			if gmr != nil {
				if n, err := gmr.GroupMembers(ctx, topic, group); err == nil {
					g.Members = n
				}
			}
			return g, nil
		}, func() {}, nil
	}
	return nil, nil, fmt.Errorf("lag: the %s transport cannot read a consumer group's lag from outside the group: %w",
		scheme(a.rawURL), omnibus.ErrUnsupported)
}

// runLag samples with read and prints reports: once after o.samples
// samples, or after every sample with o.watch.
func runLag(ctx context.Context, w io.Writer, o lagOptions, read func() lagSample) error {
	term := isTerminal(w)
	var window []lagSample
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	for n := 1; ; n++ {
		s := read()
		if ctx.Err() != nil {
			if o.watch {
				return nil
			}
			return ctx.Err()
		}
		if s.Err != nil && !o.watch {
			return fmt.Errorf("lag: %w", s.Err)
		}
		if s.Err != nil && (errors.Is(s.Err, omnibus.ErrNotFound) || errors.Is(s.Err, omnibus.ErrUnsupported)) {
			return fmt.Errorf("lag: %w", s.Err)
		}
		window = append(window, s)
		if len(window) > o.window {
			window = window[1:]
		}
		if o.watch || n >= o.samples {
			r := report(o.topic, o.group, window)
			if o.watch && term && !o.json {
				fmt.Fprint(w, "\033[H\033[2J")
			}
			if err := printLag(w, r, o.json); err != nil {
				return err
			}
			if !o.watch {
				return nil
			}
			if !term && !o.json {
				fmt.Fprintln(w)
			}
		}
		select {
		case <-ctx.Done():
			if o.watch {
				return nil
			}
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

// report judges every lane seen in window; the newest sample gives the lag.
func report(topic, group string, window []lagSample) lagReport {
	last := window[len(window)-1]
	r := lagReport{Topic: topic, Group: group, Time: last.At, Status: statusOK}
	if last.Millis {
		r.Unit = "ms"
	}
	if last.Err != nil {
		r.Error = last.Err.Error()
	}
	// The lanes: those of the newest successful sample, else any seen.
	var lanes []string
	seen := map[string]bool{}
	for i := len(window) - 1; i >= 0 && lanes == nil; i-- {
		for _, l := range window[i].Lanes {
			if !seen[l.Lane] {
				seen[l.Lane] = true
				lanes = append(lanes, l.Lane)
			}
		}
	}
	var statuses []laneStatus
	for _, lane := range lanes {
		points := make([]lagPoint, len(window))
		for i, s := range window {
			points[i] = lagPoint{Committed: -1, Members: s.Members}
			if s.Err != nil {
				points[i].Members = -1
			}
			for _, l := range s.Lanes {
				if l.Lane == lane {
					points[i].Lag, points[i].Known = l.Lag, l.Known
				}
			}
			if c, ok := s.Committed[lane]; ok && points[i].Known {
				points[i].Committed = c
			}
		}
		p := points[len(points)-1]
		lr := laneReport{Lane: lane, Lag: p.Lag, Known: p.Known, Status: classify(points)}
		for _, l := range last.Lanes {
			if l.Lane == lane && l.AgeKnown {
				age := l.Age.Seconds()
				lr.Age = &age
				if r.MaxAge == nil || age > *r.MaxAge {
					r.MaxAge = &age
				}
			}
		}
		switch {
		case p.Known && last.Millis:
			r.Total = max(r.Total, p.Lag)
		case p.Known:
			r.Total += p.Lag
		default:
			r.Unknown++
			lr.Lag = 0
		}
		statuses = append(statuses, lr.Status)
		r.Lanes = append(r.Lanes, lr)
	}
	r.Status = worst(statuses...)
	if last.Err != nil {
		r.Status = statusUnknown
	}
	if r.Lanes == nil {
		r.Lanes = []laneReport{}
	}
	return r
}

func printLag(w io.Writer, r lagReport, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	fmt.Fprintf(w, "topic %s  group %s  %s\n", r.Topic, r.Group, r.Time.Format(time.TimeOnly))
	if r.Error != "" {
		fmt.Fprintf(w, "lag read failed: %s\n", oneLine(r.Error))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "LAG"
	if r.Unit != "" {
		header = "LAG(" + r.Unit + ")"
	}
	fmt.Fprintf(tw, "LANE\t%s\tAGE\tSTATUS\t\n", header)
	for _, l := range r.Lanes {
		lag := fmt.Sprint(l.Lag)
		if !l.Known {
			lag = "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", l.Lane, lag, ageText(l.Age), l.Status)
	}
	total := fmt.Sprint(r.Total)
	if r.Unknown > 0 {
		total += "+?"
	}
	fmt.Fprintf(tw, "total\t%s\t%s\t%s\t\n", total, ageText(r.MaxAge), r.Status)
	return tw.Flush()
}

// ageText is an age in seconds for the table: "?" when unknown, whole
// seconds from 10s up.
func ageText(age *float64) string {
	switch {
	case age == nil:
		return "?"
	case *age >= 10:
		return (time.Duration(*age) * time.Second).String()
	}
	return (time.Duration(*age*1000) * time.Millisecond).String()
}
