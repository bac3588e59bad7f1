package promomnibus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/promomnibus"
)

func TestMain(m *testing.M) {
	if os.Getenv("PROM_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	goleak.VerifyTestMain(m)
}

// schemes are the transport label of each transport.
var schemes = map[string]string{"membus": "mem", "kafka": "kafka", "rabbitmq": "amqp", "nats": "nats"}

// The collector over HTTP after a known workload, on every transport:
// observetest's workload (10 messages, a retry, a dead letter, 3 held),
// and one oversized message refused; a
// watched group that reads the same group from outside (its series are
// not sent twice), and one whose reads fail. Each family is scraped,
// parsed with the Prometheus text parser and checked.
func TestScrape(t *testing.T) {
	for _, tr := range observetest.Transports {
		t.Run(tr.Name, func(t *testing.T) {
			ns := observetest.Namespace()
			raw := tr.URL(t, ns)
			topic, group := ns+".orders", ns+"-billing"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			col := promomnibus.New()
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(col)
			srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
			defer srv.Close()
			c := observetest.Open(t, raw, omnibus.WithHooks(col))
			if err := c.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}
			transport := schemes[tr.Name]
			w := observetest.StartWorkload(t, ctx, c, topic, group)
			k := w.Consumer
			if c.Capabilities().Lag != 0 { // the same group, read from outside: no series twice
				defer col.WatchGroup(transport, topic, group, func(ctx context.Context) (promomnibus.GroupLag, error) {
					lags, err := c.Lag(ctx, topic, group)
					return promomnibus.GroupLag{Lanes: lags, Members: 1}, err
				})()
			}
			defer col.WatchGroup(transport, topic, "gone", func(ctx context.Context) (promomnibus.GroupLag, error) {
				return promomnibus.GroupLag{}, fmt.Errorf("group %q: %w", "gone", omnibus.ErrNotFound)
			})()

			oversized := 0
			if max := c.Capabilities().MaxMessageBytes; max > 0 && max < 8<<20 {
				if err := c.Publish(ctx, topic, &omnibus.Message{Body: make([]byte, max+1)}); !errors.Is(err, omnibus.ErrTooLarge) {
					t.Fatalf("oversized publish: %v, want ErrTooLarge", err)
				}
				oversized = 1
			}
			var mfs map[string]*dto.MetricFamily
			observetest.Eventually(t, 30*time.Second, func() error {
				mfs = scrape(t, srv.URL)
				if n := sum(mfs, "omnibus_in_flight_messages", group); n != 3 {
					return fmt.Errorf("in flight %v, want the 3 held", n)
				}
				if n := sum(mfs, "omnibus_lag_messages", group); c.Capabilities().Lag != 0 && n != 3 {
					return fmt.Errorf("lag %v, want the 3 held", n)
				}
				return nil
			})
			want := []struct {
				family string
				group  string // "" for the client's publishes
				ok     func(float64) bool
				says   string
			}{
				{"omnibus_published_messages_total", "", eq(13), "13"},
				{"omnibus_publish_failed_messages_total", "", eq(float64(oversized)), fmt.Sprint(oversized)},
				{"omnibus_publish_duration_seconds", "", eq(float64(2 + oversized)), "a sample per Publish"},
				{"omnibus_received_messages_total", group, atLeast(13), "at least 13"},
				{"omnibus_received_bytes_total", group, atLeast(13), "at least a byte each"},
				{"omnibus_handled_messages_total", group, eq(11), "11: 10 and a retry"},
				{"omnibus_handler_errors_total", group, eq(2), "2"},
				{"omnibus_handle_duration_seconds", group, eq(11), "a sample per handled message"},
				{"omnibus_retries_total", group, eq(1), "1"},
				{"omnibus_dead_letters_total", group, eq(1), "1"},
				{"omnibus_lane_changes_total", group, atLeast(1), "a lane claimed at least"},
				{"omnibus_members", group, eq(1), "1"},
				{"omnibus_in_flight_messages", group, eq(3), "3"},
				{"omnibus_lag_unknown_lanes", group, eq(0), "0"},
				{"omnibus_lag_read_errors_total", "gone", atLeast(1), "a failed read per scrape"},
				{"omnibus_lag_unknown_lanes", "gone", eq(0), "0 (no lane known)"},
			}
			if c.Capabilities().Lag != 0 {
				want = append(want, struct {
					family, group string
					ok            func(float64) bool
					says          string
				}{"omnibus_lag_messages", group, eq(3), "3"}, struct {
					family, group string
					ok            func(float64) bool
					says          string
				}{"omnibus_group_members", group, eq(1), "1, as the watch read it"})
			}
			if c.Capabilities().Age {
				want = append(want, struct {
					family, group string
					ok            func(float64) bool
					says          string
				}{"omnibus_lag_seconds", group, atLeast(1e-6), "above 0: the 3 held were published before the scrape"})
			}
			for _, w := range want {
				mf := mfs[w.family]
				if mf == nil {
					t.Errorf("no family %s", w.family)
					continue
				}
				if got := sum(mfs, w.family, w.group); !w.ok(got) {
					t.Errorf("%s{group=%q} = %v, want %s", w.family, w.group, got, w.says)
				}
				for _, m := range mf.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if labels["transport"] != transport || labels["topic"] != topic {
						t.Errorf("%s: labels %v, want transport %q and topic %q", w.family, labels, transport, topic)
					}
					if _, ok := labels["lane"]; ok && labels["lane"] == "" {
						t.Errorf("%s: empty lane label", w.family)
					}
				}
			}
			for name, mf := range mfs {
				if !strings.HasPrefix(name, "omnibus_") {
					continue
				}
				switch mf.GetType() {
				case dto.MetricType_COUNTER:
					if !strings.HasSuffix(name, "_total") {
						t.Errorf("counter %s does not end in _total", name)
					}
				case dto.MetricType_HISTOGRAM:
					if !strings.HasSuffix(name, "_seconds") {
						t.Errorf("histogram %s does not end in _seconds", name)
					}
				}
			}
			w.Release()
			if err := k.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			mfs = scrape(t, srv.URL)
			if n := len(mfs["omnibus_members"].GetMetric()); n != 0 {
				t.Errorf("a stopped consumer still has %d omnibus_members series", n)
			}
			if n := sum(mfs, "omnibus_handled_messages_total", group); n != 14 {
				t.Errorf("omnibus_handled_messages_total = %v after the held were released, want 14", n)
			}
		})
	}
}

func eq(n float64) func(float64) bool      { return func(v float64) bool { return v == n } }
func atLeast(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }

// scrape gets /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// sum adds the values of a family's series of group ("" for series
// without a group label): a counter's or gauge's value, a histogram's
// sample count.
func sum(mfs map[string]*dto.MetricFamily, family, group string) float64 {
	var n float64
	for _, m := range mfs[family].GetMetric() {
		g := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "group" {
				g = l.GetValue()
			}
		}
		if g != group {
			continue
		}
		switch {
		case m.Counter != nil:
			n += m.GetCounter().GetValue()
		case m.Gauge != nil:
			n += m.GetGauge().GetValue()
		case m.Histogram != nil:
			n += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return n
}
