package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// running is a command running in-process in the background.
type running struct {
	stdout, stderr testenv.Buffer
	cancel         context.CancelFunc // Ctrl-C
	done           chan int           // its exit code
}

// runAsync runs the command in-process until cancel (Ctrl-C); cleanup
// cancels it and waits for it.
func runAsync(t testing.TB, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	r := &running{cancel: cancel, done: make(chan int, 1)}
	a := &app{stdin: strings.NewReader(""), stdout: &r.stdout, stderr: &r.stderr, getenv: func(string) string { return "" }}
	go func() { r.done <- a.run(ctx, args) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Errorf("omnibus %v did not end after Ctrl-C", args)
		}
	})
	return r
}

// stop sends Ctrl-C and returns the exit code.
func (r *running) stop(t testing.TB) int {
	t.Helper()
	r.cancel()
	select {
	case code := <-r.done:
		r.done <- code // for cleanup
		return code
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not end after Ctrl-C")
		return -1
	}
}

var metricsURL = regexp.MustCompile(`http://[^ \n]+/metrics`)

// metricsAt waits until the command names its metrics URL on out.
func (r *running) metricsAt(t testing.TB, out *testenv.Buffer) string {
	t.Helper()
	var u string
	eventually(t, 30*time.Second, func() error {
		select {
		case code := <-r.done:
			r.done <- code
			t.Fatalf("the command ended (exit %d) without serving metrics\nstdout: %s\nstderr: %s", code, r.stdout.String(), r.stderr.String())
		default:
		}
		if u = metricsURL.FindString(out.String()); u == "" {
			return fmt.Errorf("no metrics URL printed yet: %q", out.String())
		}
		return nil
	})
	return u
}

// scrapeMetrics gets url and parses it with the Prometheus text parser.
func scrapeMetrics(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return mfs
}

// series sums a family's values over the series whose labels include
// want, and says how many there were.
func series(mfs map[string]*dto.MetricFamily, family string, want map[string]string) (sum float64, n int) {
	for _, m := range mfs[family].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		n++
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum, n
}

// TestExporterOnEveryTransport: the exporter serves a group's lag per
// lane on every transport without consuming (the lag stays), counts the
// failed reads of a group that does not exist and goes on, and ends
// cleanly on Ctrl-C.
func TestExporterOnEveryTransport(t *testing.T) {
	transports := append(onEveryTransport(2), serverTopic{"mem", func(t testing.TB) (string, string) { raw, _ := memURL(t, "?partitions=2"); return raw, "t" }})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			raw, topic := tr.url(t)
			ctx := ctxT(t)
			c, err := omnibus.Open(ctx, raw)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}
			// A group whose members have left, then 50 messages for it.
			left, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("left"))
			if err != nil {
				t.Fatal(err)
			}
			go left.Run(ctx)
			time.Sleep(200 * time.Millisecond)
			if err := left.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			ms := make([]*omnibus.Message, 50)
			for i := range ms {
				ms[i] = &omnibus.Message{Key: fmt.Sprint("k", i), Body: []byte("x")}
			}
			if err := c.Publish(ctx, topic, ms...); err != nil {
				t.Fatal(err)
			}

			r := runAsync(t, "exporter", "--url", raw, "--topic", topic, "--group", "left", "--group", "nosuch", "--metrics-addr", "127.0.0.1:0")
			url := r.metricsAt(t, &r.stdout)
			transport := scheme(raw)
			leftLabels := map[string]string{"transport": transport, "topic": topic, "group": "left"}
			var mfs map[string]*dto.MetricFamily
			eventually(t, 30*time.Second, func() error {
				mfs = scrapeMetrics(t, url)
				if lag, n := series(mfs, "omnibus_lag_messages", leftLabels); lag != 50 || n == 0 {
					return fmt.Errorf("omnibus_lag_messages %v over %d lanes, want 50", lag, n)
				}
				return nil
			})
			if _, n := series(mfs, "omnibus_lag_messages", map[string]string{"lane": ""}); n != 0 {
				t.Errorf("a lag series without a lane")
			}
			if unknown, n := series(mfs, "omnibus_lag_unknown_lanes", leftLabels); unknown != 0 || n != 1 {
				t.Errorf("omnibus_lag_unknown_lanes %v (%d series), want 0", unknown, n)
			}
			if members, n := series(mfs, "omnibus_group_members", leftLabels); n == 1 && members != 0 {
				t.Errorf("omnibus_group_members %v, want 0: the group's members left", members)
			}
			if errs, _ := series(mfs, "omnibus_lag_read_errors_total", map[string]string{"group": "nosuch"}); errs < 1 {
				t.Errorf("omnibus_lag_read_errors_total{group=nosuch} %v, want the failed reads counted", errs)
			}
			if _, n := series(mfs, "omnibus_lag_messages", map[string]string{"group": "nosuch"}); n != 0 {
				t.Errorf("a group that does not exist has %d lag series, want none", n)
			}
			time.Sleep(300 * time.Millisecond)
			if lag, _ := series(scrapeMetrics(t, url), "omnibus_lag_messages", leftLabels); lag != 50 {
				t.Errorf("lag %v after more scrapes, want still 50: the exporter must not consume", lag)
			}
			if code := r.stop(t); code != exitOK {
				t.Errorf("exit %d after Ctrl-C, want 0\nstderr: %s", code, r.stderr.String())
			}
			if _, err := http.Get(url); err == nil {
				t.Errorf("%s still answers after the exporter ended", url)
			}
		})
	}
}

// TestTailMetricsAddr: tail --metrics-addr serves the consumer's metrics
// while it prints the messages.
func TestTailMetricsAddr(t *testing.T) {
	raw, c := memURL(t, "?partitions=2")
	r := runAsync(t, "tail", "--url", raw, "--topic", "t", "--group", "g", "--from", "earliest", "--json", "--metrics-addr", "127.0.0.1:0")
	url := r.metricsAt(t, &r.stderr)
	if err := c.Publish(ctxT(t), "t", &omnibus.Message{Body: []byte("a")}, &omnibus.Message{Body: []byte("b")}, &omnibus.Message{Body: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"transport": "mem", "topic": "t", "group": "g"}
	eventually(t, 30*time.Second, func() error {
		mfs := scrapeMetrics(t, url)
		if n, _ := series(mfs, "omnibus_handled_messages_total", labels); n != 3 {
			return fmt.Errorf("omnibus_handled_messages_total %v, want 3", n)
		}
		if n, _ := series(mfs, "omnibus_members", labels); n != 1 {
			return fmt.Errorf("omnibus_members %v, want 1", n)
		}
		if mfs["go_goroutines"] == nil {
			return fmt.Errorf("no go_goroutines: the runtime's metrics are missing")
		}
		return nil
	})
	if code := r.stop(t); code != exitOK {
		t.Fatalf("exit %d, want 0\nstderr: %s", code, r.stderr.String())
	}
	if n := strings.Count(r.stdout.String(), "\n"); n != 3 {
		t.Errorf("tail printed %d lines, want 3:\n%s", n, r.stdout.String())
	}
}

// TestMetricsAddrErrors: a missing flag is a usage error; an address
// that cannot be listened on is one line naming it.
func TestMetricsAddrErrors(t *testing.T) {
	raw, _ := memURL(t, "")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"exporter", "--url", raw, "--topic", "t"}, exitUsage, "--group is required"},
		{[]string{"exporter", "--url", raw, "--group", "g"}, exitUsage, "--topic is required"},
		{[]string{"exporter", "--url", raw, "--topic", "t", "--group", "g", "--metrics-addr", busy.Addr().String()}, exitFailed, "--metrics-addr " + busy.Addr().String()},
		{[]string{"tail", "--url", raw, "--topic", "t", "--metrics-addr", "127.0.0.1:99999"}, exitFailed, "--metrics-addr 127.0.0.1:99999"},
	} {
		r := runCmd(t, ctxT(t), nil, "", tc.args...)
		wantCode(t, r, tc.code)
		wantOneLineError(t, r, tc.want, "")
	}
}
