package promomnibus

// The Collector: its metric families, and the gauges read at scrape time
// from the consumers it was bound to and the groups it watches.

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/observe"
)

// Label names.
const (
	LabelTransport = "transport"
	LabelTopic     = "topic"
	LabelGroup     = "group"
	LabelLane      = "lane"
	LabelChange    = "change"
)

var (
	topicLabels = []string{LabelTransport, LabelTopic}
	groupLabels = []string{LabelTransport, LabelTopic, LabelGroup}
	laneLabels  = []string{LabelTransport, LabelTopic, LabelGroup, LabelLane}
)

// Collector is a prometheus.Collector of omnibus's metrics and an omnibus
// hook that feeds it: register it with a prometheus.Registerer and pass
// it to omnibus.WithHooks (or omnibus.Hooks). Create it with New.
type Collector struct {
	published      *prometheus.CounterVec
	publishFailed  *prometheus.CounterVec
	publishTime    *prometheus.HistogramVec
	received       *prometheus.CounterVec
	receivedBytes  *prometheus.CounterVec
	handled        *prometheus.CounterVec
	handlerErrors  *prometheus.CounterVec
	handleTime     *prometheus.HistogramVec
	retries        *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	deadLetterFail *prometheus.CounterVec
	laneChanges    *prometheus.CounterVec
	lagReadErrors  *prometheus.CounterVec

	members      *prometheus.Desc
	inFlight     *prometheus.Desc
	lagMessages  *prometheus.Desc
	lagSeconds   *prometheus.Desc
	lagUnknown   *prometheus.Desc
	groupMembers *prometheus.Desc

	consumers observe.Consumers[[]string] // with their group labels

	mu     sync.Mutex
	groups map[*watched]struct{}
}

// New returns a Collector.
func New() *Collector {
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "omnibus", Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, labels []string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "omnibus", Name: name, Help: help, Buckets: prometheus.DefBuckets}, labels)
	}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("omnibus_"+name, help, labels, nil)
	}
	return &Collector{
		published:      counter("published_messages_total", "Messages published.", topicLabels),
		publishFailed:  counter("publish_failed_messages_total", "Messages whose publish failed.", topicLabels),
		publishTime:    histogram("publish_duration_seconds", "Time a Publish call took.", topicLabels),
		received:       counter("received_messages_total", "Messages received from the transport.", groupLabels),
		receivedBytes:  counter("received_bytes_total", "Bytes of messages received from the transport.", groupLabels),
		handled:        counter("handled_messages_total", "Messages handled, each attempt counted.", laneLabels),
		handlerErrors:  counter("handler_errors_total", "Handler attempts that failed (an error or a panic).", laneLabels),
		handleTime:     histogram("handle_duration_seconds", "Time a handler call took.", groupLabels),
		retries:        counter("retries_total", "Retries scheduled after a failed attempt.", laneLabels),
		deadLetters:    counter("dead_letters_total", "Messages published to the dead-letter topic.", laneLabels),
		deadLetterFail: counter("dead_letter_failures_total", "Dead-letter publishes that failed (the message is tried again).", laneLabels),
		laneChanges:    counter("lane_changes_total", "Lanes claimed, revoked or lost by the group's members here.", append(groupLabels[:3:3], LabelChange)),
		lagReadErrors:  counter("lag_read_errors_total", "Lag reads that failed at scrape time.", groupLabels),

		members:      desc("members", "Group members the consumers run in this process.", groupLabels),
		inFlight:     desc("in_flight_messages", "Messages received and not settled.", laneLabels),
		lagMessages:  desc("lag_messages", "The group's lag in records or messages, as the transport counts it; absent when unknown.", laneLabels),
		lagSeconds:   desc("lag_seconds", "Age of the lane's oldest unsettled message, where the transport tells.", laneLabels),
		lagUnknown:   desc("lag_unknown_lanes", "Lanes whose lag the transport could not tell.", groupLabels),
		groupMembers: desc("group_members", "Members of the whole group, as the transport tells (watched groups).", groupLabels),
		groups:       map[*watched]struct{}{},
	}
}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.published, c.publishFailed, c.publishTime, c.received, c.receivedBytes,
		c.handled, c.handlerErrors, c.handleTime, c.retries, c.deadLetters, c.deadLetterFail, c.laneChanges, c.lagReadErrors}
}

// Describe sends the descriptions of every metric (prometheus.Collector).
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{c.members, c.inFlight, c.lagMessages, c.lagSeconds, c.lagUnknown, c.groupMembers} {
		ch <- d
	}
}

// GroupLag is a reading of a consumer group from outside it.
type GroupLag struct {
	Lanes []omnibus.LaneLag
	// Kind is what Lanes' Lag is (the transport's Capabilities.Lag): of
	// kind LagMillis (Kinesis), it is a time, and omnibus_lag_messages
	// has no series for the lanes (omnibus_lag_seconds has their age).
	// Any other kind, the zero value too, is a count.
	Kind driver.LagKind
	// Members is the number of the group's members, -1 when the
	// transport cannot tell.
	Members int
}

// watched is a group whose lag is read at scrape time.
type watched struct {
	labels []string
	read   func(context.Context) (GroupLag, error)
}

// WatchGroup exports the lag and members of a consumer group that this
// process does not consume, read with read (bounded by 5 s) at every
// scrape, under the labels transport, topic and group. The returned
// function stops watching it. Consumers the Collector is bound to as a
// hook need no watching.
func (c *Collector) WatchGroup(transport, topic, group string, read func(context.Context) (GroupLag, error)) (stop func()) {
	w := &watched{labels: []string{transport, topic, group}, read: read}
	c.mu.Lock()
	c.groups[w] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.groups, w)
		c.mu.Unlock()
	}
}

// gauges sums what several consumers (or a consumer and a watched group)
// of one topic and group report, so each series is sent once.
type gauges struct {
	groups       map[[3]string]bool // every group read: its unknown lanes are reported, 0 too
	members      map[[3]string]int
	groupMembers map[[3]string]int
	inFlight     map[[4]string]int
	lag          map[[4]string]observe.Lane // a known report wins
}

func (g *gauges) lanes(group []string, lanes []observe.Lane) {
	g.groups[[3]string(group)] = true
	for _, l := range lanes {
		k := [4]string{group[0], group[1], group[2], l.Lane}
		if old, seen := g.lag[k]; !seen || !old.MessagesKnown {
			g.lag[k] = l
		}
	}
}

// Collect reads the gauges and sends every metric (prometheus.Collector).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	g := gauges{groups: map[[3]string]bool{}, members: map[[3]string]int{}, groupMembers: map[[3]string]int{},
		inFlight: map[[4]string]int{}, lag: map[[4]string]observe.Lane{}}
	for _, r := range observe.Read(ctx, c.consumers.Live()) {
		key := [3]string(r.Value)
		g.members[key] += r.Stats.Members
		for _, l := range r.Stats.Lanes {
			if l.Member >= 0 {
				g.inFlight[[4]string{key[0], key[1], key[2], l.Lane}] += l.InFlight
			}
		}
		if r.LagErr != nil {
			c.lagReadErrors.WithLabelValues(r.Value...).Inc()
		}
		g.lanes(r.Value, r.Lanes)
	}
	c.readGroups(ctx, &g)

	for _, v := range c.vecs() {
		v.Collect(ch)
	}
	for k, n := range g.members {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(n), k[:]...)
	}
	for k, n := range g.groupMembers {
		ch <- prometheus.MustNewConstMetric(c.groupMembers, prometheus.GaugeValue, float64(n), k[:]...)
	}
	unknown := map[[3]string]int{}
	for k := range g.groups {
		unknown[k] = 0
	}
	for k, n := range g.inFlight {
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(n), k[:]...)
	}
	for k, l := range g.lag {
		if !l.MessagesKnown {
			unknown[[3]string(k[:3])]++
		}
		if l.MessagesKnown {
			ch <- prometheus.MustNewConstMetric(c.lagMessages, prometheus.GaugeValue, float64(l.Messages), k[:]...)
		}
		if l.SecondsKnown {
			ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, l.Seconds, k[:]...)
		}
	}
	for k, n := range unknown {
		ch <- prometheus.MustNewConstMetric(c.lagUnknown, prometheus.GaugeValue, float64(n), k[:]...)
	}
}

// readGroups reads the watched groups, concurrently.
func (c *Collector) readGroups(ctx context.Context, g *gauges) {
	c.mu.Lock()
	ws := make([]*watched, 0, len(c.groups))
	for w := range c.groups {
		ws = append(ws, w)
	}
	c.mu.Unlock()
	type result struct {
		gl  GroupLag
		err error
	}
	results := make([]result, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, observe.LagTimeout)
			defer cancel()
			results[i].gl, results[i].err = w.read(rctx)
		})
	}
	wg.Wait()
	for i, w := range ws {
		if err := results[i].err; err != nil {
			c.lagReadErrors.WithLabelValues(w.labels...).Inc()
			g.lanes(w.labels, nil)
			continue
		}
		if n := results[i].gl.Members; n >= 0 {
			g.groupMembers[[3]string(w.labels)] = n
		}
		g.lanes(w.labels, observe.FromLags(results[i].gl.Lanes, results[i].gl.Kind))
	}
}
