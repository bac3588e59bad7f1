package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

func init() {
	lagSources["kafka"] = kafkaLagSource
	laneOwners["kafka"] = kafkaOwners
}

// kafkaSeeds are the brokers of a plain kafka:// URL.
func kafkaSeeds(rawURL string) ([]string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	if u.User != nil || q.Get("tls") == "true" || q.Has("tls_ca") {
		return nil, fmt.Errorf("reads Kafka groups over plain connections only (no SASL or TLS): %w", omnibus.ErrUnsupported)
	}
	var seeds []string
	for _, h := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "9092")
		}
		seeds = append(seeds, h)
	}
	return seeds, nil
}

// kafkaOwners reads, with kadm, which member of a group holds each
// partition: its client ID and host. The admin client is made at the
// first read and lives as long as the process (the console's).
func kafkaOwners(rawURL string) ownersFunc {
	var (
		once sync.Once
		adm  *kadm.Client
		err  error
	)
	return func(ctx context.Context, _ *omnibus.Client, topic, group string) (map[string]string, error) {
		once.Do(func() {
			var seeds []string
			if seeds, err = kafkaSeeds(rawURL); err != nil {
				return
			}
			var cl *kgo.Client
			if cl, err = kgo.NewClient(kgo.SeedBrokers(seeds...)); err == nil {
				adm = kadm.NewClient(cl)
			}
		})
		if err != nil {
			return nil, err
		}
		groups, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, m := range groups[group].Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for _, t := range a.Topics {
				if t.Topic != topic {
					continue
				}
				for _, p := range t.Partitions {
					out[strconv.Itoa(int(p))] = m.ClientID + "@" + strings.TrimPrefix(m.ClientHost, "/")
				}
			}
		}
		return out, nil
	}
}

// kafkaLagSource reads a Kafka group's lag with kadm, from outside the
// group: committed offsets, end offsets and the group's members, which
// tell a stalled lane from a stopped group, with the ages kafkabus reads
// (the record timestamps at the committed offsets). It reads plain kafka:// URLs only; SASL and TLS
// settings live in kafkabus.
func kafkaLagSource(_ context.Context, c *omnibus.Client, rawURL string) (lagSource, func(), error) {
	seeds, err := kafkaSeeds(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("lag: %w", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, nil, fmt.Errorf("lag: kafka client: %w", err)
	}
	adm := kadm.NewClient(cl)
	src := func(ctx context.Context, topic, group string) (groupLag, error) {
		g := groupLag{Members: -1, Committed: map[string]int64{}}
		lags, err := adm.Lag(ctx, group)
		if err != nil {
			return g, err
		}
		dl, ok := lags[group]
		if !ok || dl.State == "Dead" {
			return g, fmt.Errorf("group %q: %w", group, omnibus.ErrNotFound)
		}
		if err := dl.Error(); err != nil {
			return g, err
		}
		g.Members = len(dl.Members)
		if len(dl.Lag[topic]) == 0 {
			// The group has no position on the topic: say whether the
			// topic exists at all, rather than report no lag.
			topics, err := adm.ListTopics(ctx, topic)
			if err != nil {
				return g, err
			}
			if !topics.Has(topic) || topics[topic].Err != nil {
				return g, fmt.Errorf("topic %q: %w", topic, omnibus.ErrNotFound)
			}
			return g, fmt.Errorf("group %q has no position on topic %q (it never consumed it): %w", group, topic, omnibus.ErrNotFound)
		}
		for p, l := range dl.Lag[topic] {
			lane := strconv.Itoa(int(p))
			known := l.Err == nil && l.Lag >= 0
			g.Lanes = append(g.Lanes, driver.LaneLag{Lane: lane, Lag: max(l.Lag, 0), Known: known})
			if known && l.Commit.At >= 0 {
				g.Committed[lane] = l.Commit.At
			}
		}
		// The ages, from kafkabus (the record timestamps at the
		// committed offsets).
		if aged, err := c.Lag(ctx, topic, group); err == nil {
			for i, l := range g.Lanes {
				for _, a := range aged {
					if a.Lane == l.Lane && a.AgeKnown && a.Known && a.Lag == l.Lag {
						g.Lanes[i].Age, g.Lanes[i].AgeKnown = a.Age, true
					}
				}
			}
		}
		slices.SortFunc(g.Lanes, func(a, b driver.LaneLag) int {
			x, _ := strconv.Atoi(a.Lane)
			y, _ := strconv.Atoi(b.Lane)
			return x - y
		})
		return g, nil
	}
	return src, cl.Close, nil
}
