package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
)

// screen shows the demo's progress: a block redrawn in place a few times
// a second on a terminal, plain periodic lines elsewhere. It is used by the
// demo's watch loop only.
type screen struct {
	w      io.Writer
	term   bool
	period time.Duration
	d      *demo
	k      *omnibus.Consumer

	lines     int // lines of the block drawn last (terminal)
	seen      int // events printed (plain)
	lastPlain time.Time
	samples   []rateSample
	lagNote   string
}

type rateSample struct {
	at time.Time
	n  int
}

func newScreen(w io.Writer, d *demo, k *omnibus.Consumer) *screen {
	s := &screen{w: w, term: isTerminal(w), d: d, k: k, period: 250 * time.Millisecond}
	if !s.term {
		s.period = 100 * time.Millisecond // checks for completion; lines once a second
	}
	return s
}

func (s *screen) header() {
	d := s.d
	order := "key order (per customer)"
	if !d.ordered {
		order = "unordered lanes"
	}
	scale := fmt.Sprintf("1 consumer → %d", d.o.consumers)
	if d.o.consumers == 1 {
		scale = "1 consumer"
	}
	rate := "as fast as possible"
	if d.o.rate > 0 {
		rate = fmt.Sprintf("%.0f/s", d.o.rate)
	}
	fmt.Fprintf(s.w, "omnibus demo on %s: topic %s, %d lanes, %s, %s\n", d.url, d.topic, d.o.lanes, order, scale)
	fmt.Fprintf(s.w, "%d orders from %d customers at %s, %d of them poison; dead letters go to %s\n\n",
		d.o.orders, d.o.customers, rate, d.o.poison, d.dlq)
}

// stats is one snapshot for the screen.
type stats struct {
	elapsed    time.Duration
	published  int64
	processed  int
	dead       int
	retries    int64
	consumers  int
	inflight   int
	throughput float64
	lags       []omnibus.LaneLag
	lagTotal   int64
}

func (s *screen) snapshot(ctx context.Context) stats {
	d := s.d
	st := stats{elapsed: time.Since(d.start), published: d.published.Load(), retries: d.retries.Load()}
	st.processed, st.dead = d.led.counts()
	ks := s.k.Stats()
	st.consumers, st.inflight = ks.Members, ks.InFlight

	now := time.Now()
	s.samples = append(s.samples, rateSample{now, st.processed})
	for len(s.samples) > 2 && now.Sub(s.samples[1].at) >= time.Second {
		s.samples = s.samples[1:]
	}
	if first := s.samples[0]; now.Sub(first.at) > 0 {
		st.throughput = float64(st.processed-first.n) / now.Sub(first.at).Seconds()
	}

	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	lags, err := s.k.Lag(lctx)
	if err != nil {
		s.lagNote = "lag: " + firstLine(err)
	} else {
		s.lagNote = ""
		st.lags = lags
		for _, l := range lags {
			if l.Known {
				st.lagTotal += l.Lag
			}
		}
	}
	return st
}

func (s *screen) draw(ctx context.Context) {
	st := s.snapshot(ctx)
	if s.term {
		s.drawBlock(st)
		return
	}
	events, total := s.d.events.since(s.seen)
	s.seen = total
	for _, e := range events {
		fmt.Fprintln(s.w, e)
	}
	if time.Since(s.lastPlain) >= time.Second {
		s.lastPlain = time.Now()
		s.plainLine(st)
	}
}

func (s *screen) plainLine(st stats) {
	var lanes []string
	for _, l := range st.lags {
		v := "?"
		if l.Known {
			v = fmt.Sprint(l.Lag)
		}
		lanes = append(lanes, l.Lane+":"+v)
	}
	lag := "n/a"
	if st.lags != nil {
		lag = fmt.Sprintf("%d [%s]", st.lagTotal, strings.Join(lanes, " "))
	}
	fmt.Fprintf(s.w, "%5.1fs  published %d/%d  processed %d  %.0f/s  consumers %d  in flight %d  lag %s  dead-lettered %d  retries %d\n",
		st.elapsed.Seconds(), st.published, s.d.o.orders, st.processed, st.throughput, st.consumers, st.inflight, lag, st.dead, st.retries)
}

func (s *screen) drawBlock(st stats) {
	var b strings.Builder
	fmt.Fprintf(&b, "  elapsed    %6.1fs    published %6d / %-6d  processed     %6d   throughput %5.0f orders/s\n",
		st.elapsed.Seconds(), st.published, s.d.o.orders, st.processed, st.throughput)
	fmt.Fprintf(&b, "  consumers  %6d     in flight %6d           retries       %6d   dead-lettered %d\n",
		st.consumers, st.inflight, st.retries, st.dead)
	switch {
	case s.lagNote != "":
		fmt.Fprintf(&b, "  %s\n", s.lagNote)
	default:
		fmt.Fprintf(&b, "  lag per lane (total %d)\n", st.lagTotal)
		scale := int64(50)
		for _, l := range st.lags {
			scale = max(scale, l.Lag)
		}
		const width = 40
		for _, l := range st.lags {
			if !l.Known {
				fmt.Fprintf(&b, "  %4s  %-*s      ?\n", l.Lane, width, "")
				continue
			}
			n := int(l.Lag * width / scale)
			fmt.Fprintf(&b, "  %4s  %-*s %6d\n", l.Lane, width, strings.Repeat("█", n)+strings.Repeat("·", width-n), l.Lag)
		}
	}
	b.WriteString("  events\n")
	for _, e := range s.d.events.last(5) {
		fmt.Fprintf(&b, "    %s\n", e)
	}
	if s.lines > 0 {
		fmt.Fprintf(s.w, "\033[%dA\033[J", s.lines) // back to the block's top, clear below
	}
	out := b.String()
	fmt.Fprint(s.w, out)
	s.lines = strings.Count(out, "\n")
}

// final prints the state at the end.
func (s *screen) final() {
	if s.term {
		return // the block stays on screen as drawn last
	}
	events, total := s.d.events.since(s.seen)
	s.seen = total
	for _, e := range events {
		fmt.Fprintln(s.w, e)
	}
}
