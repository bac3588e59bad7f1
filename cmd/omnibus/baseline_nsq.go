package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/nsqbus"
)

func init() {
	baselines[nsqbus.Scheme] = baseline{client: "go-nsq", run: nsqBaseline}
}

// nsqBaseline does bench's work with go-nsq as its users write it: a
// Producer's MultiPublish of plain bodies in batches of --batch, each
// waiting for nsqd's answer, and a Consumer (subscribed before the
// first publish) whose handler returns nil, so go-nsq sends FIN, with
// the window of omnibus's default MaxInFlight. It uses the URL's first
// nsqd; a URL of nsqlookupds (lookup=true) has no baseline. It deletes
// its topic, with the channel, when done.
func nsqBaseline(ctx context.Context, c *omnibus.Client, rawURL, topic string, o benchOptions, left *leftovers) (pubRate, conRate float64, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, 0, err
	}
	if u.Query().Get("lookup") == "true" {
		return 0, 0, errors.New("the baseline needs an nsqd's address, and the URL names nsqlookupds")
	}
	addr, _, _ := strings.Cut(u.Host, ",")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.Trim(addr, "[]"), "4150")
	}
	cfg := nsq.NewConfig()
	if u.User != nil {
		cfg.AuthSecret = u.User.Username()
		if p, ok := u.User.Password(); ok {
			cfg.AuthSecret = p
		}
	}
	const window = 256 // omnibus.MaxInFlight's default
	cfg.MaxInFlight = window
	cons, err := nsq.NewConsumer(topic, "raw", cfg)
	if err != nil {
		return 0, 0, err
	}
	cons.SetLoggerLevel(nsq.LogLevelError)
	var received, last atomic.Int64
	done := make(chan struct{})
	cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		last.Store(time.Now().UnixNano())
		if received.Add(1) == int64(o.count) {
			close(done)
		}
		return nil
	}))
	// go-nsq cannot delete a topic: nsqbus does it, on every nsqd, once
	// the consumer stopped (a consumer connected would make it again).
	defer left.remove(ctx, "topic "+topic, func(ctx context.Context) error { return c.Driver().(topicDeleter).DeleteTopic(ctx, topic) })
	if err := cons.ConnectToNSQD(addr); err != nil {
		return 0, 0, fmt.Errorf("consumer: %w", err)
	}
	defer func() { cons.Stop(); <-cons.StopChan }()
	p, err := nsq.NewProducer(addr, cfg)
	if err != nil {
		return 0, 0, err
	}
	p.SetLoggerLevel(nsq.LogLevelError)
	defer p.Stop()
	// SUB goes out without waiting for nsqd's answer: a message published
	// before nsqd made the channel would still reach it (a topic keeps
	// what comes before its first channel), but would count as waiting.
	time.Sleep(100 * time.Millisecond)

	body := generatedBody(0, o.size)
	bodies := make([][]byte, 0, o.batch)
	t0 := time.Now()
	for i := 0; i < o.count; i += o.batch {
		bodies = bodies[:0]
		for j := i; j < min(o.count, i+o.batch); j++ {
			bodies = append(bodies, body)
		}
		if err := p.MultiPublish(topic, bodies); err != nil {
			return 0, 0, fmt.Errorf("publish: %w", err)
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
	}
	pubDur := time.Since(t0)
	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-timer.C:
		return 0, 0, fmt.Errorf("consumed %d of %d messages in %v", received.Load(), o.count, o.timeout)
	}
	return rate(o.count, pubDur), rate(o.count, time.Unix(0, last.Load()).Sub(t0)), nil
}
