package kafkabus_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// kcat returns the path of the kcat binary (librdkafka's CLI). It fails
// the test in CI, where .ci/run installs it, and skips elsewhere.
func kcat(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kcat")
	if err != nil {
		msg := "kcat is not installed (apt-get install -y kcat): the interoperability test needs a Kafka client nobody here wrote"
		if testenv.InCI() {
			t.Fatal(msg)
		}
		t.Skip("SKIP (missing tool): " + msg)
	}
	return p
}

// runKcat runs kcat with args and stdin, bounded by 30s.
func runKcat(t *testing.T, bin string, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kcat %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// parseHeaders parses kcat's %h output: k=v pairs separated by commas.
func parseHeaders(s string) map[string]string {
	h := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			h[k] = v
		}
	}
	return h
}

func TestKcatInterop(t *testing.T) {
	bin := kcat(t)
	cluster := newCluster(t, kfake.SeedTopics(4, "to-kcat", "from-kcat"), kfake.SeedTopics(8, "keys-kcat", "keys-omnibus"))
	broker := cluster.ListenAddrs()[0]
	c := transporttest.Open(t, clusterURL(cluster, ""))

	t.Run("kcat reads omnibus", func(t *testing.T) {
		when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
		var sent []*omnibus.Message
		for i := range 3 {
			sent = append(sent, &omnibus.Message{
				Key:         "customer-" + strconv.Itoa(i),
				Type:        "order.created",
				Source:      "/billing",
				Time:        when,
				ContentType: "application/json",
				Headers:     map[string]string{"tenant": "acme", "Trace-Id": "t1"},
				Body:        []byte(`{"order":` + strconv.Itoa(i) + `}`),
			})
		}
		if err := c.Publish(ctxT(t), "to-kcat", sent...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		out := runKcat(t, bin, "", "-C", "-b", broker, "-t", "to-kcat", "-o", "beginning", "-e", "-q", "-f", "%k\t%s\t%h\n")
		got := map[string][2]string{} // key -> body, headers
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.SplitN(line, "\t", 3)
			if len(f) != 3 {
				t.Fatalf("kcat line %q: want key, body and headers", line)
			}
			got[f[0]] = [2]string{f[1], f[2]}
		}
		if len(got) != len(sent) {
			t.Fatalf("kcat read %d records, want %d:\n%s", len(got), len(sent), out)
		}
		for _, m := range sent {
			rec, ok := got[m.Key]
			if !ok {
				t.Fatalf("kcat did not read key %q:\n%s", m.Key, out)
			}
			if rec[0] != string(m.Body) {
				t.Errorf("key %q: kcat read body %q, want %q", m.Key, rec[0], m.Body)
			}
			h := parseHeaders(rec[1])
			want := map[string]string{
				"ce_specversion": "1.0", "ce_id": m.ID, "ce_type": m.Type, "ce_source": m.Source,
				"ce_time": "2026-12-02T10:11:12.123456789Z", "content-type": "application/json", "ce_partitionkey": m.Key,
				"ce_tenant": "acme", "Trace-Id": "t1", // an extension, and a header that cannot be one
			}
			for k, v := range want {
				if h[k] != v {
					t.Errorf("key %q: header %s = %q, want %q (all: %s)", m.Key, k, h[k], v, rec[1])
				}
			}
		}
	})

	t.Run("omnibus reads kcat", func(t *testing.T) {
		runKcat(t, bin, "k1:first\nk2:second\n", "-P", "-b", broker, "-t", "from-kcat", "-K:",
			"-H", "ce_specversion=1.0", "-H", "ce_id=from-kcat-1", "-H", "ce_type=invoice.paid",
			"-H", "ce_source=/kcat", "-H", "ce_time=2026-12-02T10:00:00.5Z", "-H", "content-type=text/plain",
			"-H", "ce_tenant=acme", "-H", "Region=eu")
		runKcat(t, bin, "k3:plain\n", "-P", "-b", broker, "-t", "from-kcat", "-K:")
		var mu sync.Mutex
		got := map[string]*omnibus.Message{}
		k, err := c.Subscribe(ctxT(t), "from-kcat", func(ctx context.Context, m *omnibus.Message) error {
			mu.Lock()
			defer mu.Unlock()
			cp := *m
			got[m.Key] = &cp
			return nil
		}, omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		stop := transporttest.RunConsumer(t, k)
		transporttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 }, func() string {
			return fmt.Sprintf("received %d of 3 kcat records", len(got))
		})
		stop()
		for _, key := range []string{"k1", "k2"} {
			m := got[key]
			if m.ID != "from-kcat-1" || m.Type != "invoice.paid" || m.Source != "/kcat" || m.ContentType != "text/plain" ||
				len(m.Headers) != 2 || m.Headers["tenant"] != "acme" || m.Headers["Region"] != "eu" {
				t.Errorf("%s: id %q type %q source %q content type %q headers %v; want the ce_* headers kcat set, tenant=acme and Region=eu",
					key, m.ID, m.Type, m.Source, m.ContentType, m.Headers)
			}
			if want := time.Date(2026, 12, 2, 10, 0, 0, 5e8, time.UTC); !m.Time.Equal(want) {
				t.Errorf("%s: time %v, want %v", key, m.Time, want)
			}
		}
		if string(got["k1"].Body) != "first" || string(got["k2"].Body) != "second" {
			t.Errorf("bodies %q %q, want first, second", got["k1"].Body, got["k2"].Body)
		}
		plain := got["k3"]
		if want := "from-kcat/" + plain.Lane + "/" + plain.Position; plain.ID != want || string(plain.Body) != "plain" || plain.Time.IsZero() {
			t.Errorf("record without ce_* headers: id %q body %q time %v; want id %q, its body and the record time", plain.ID, plain.Body, plain.Time, want)
		}
	})

	t.Run("keys land where the Java client puts them", func(t *testing.T) {
		// librdkafka's murmur2_random partitioner is the Java client's
		// default for keyed records.
		var lines, keys []string
		var ms []*omnibus.Message
		for i := range 64 {
			key := "user-" + strconv.Itoa(i*7919)
			keys = append(keys, key)
			lines = append(lines, key+":x")
			ms = append(ms, &omnibus.Message{Key: key, Body: []byte("x")})
		}
		runKcat(t, bin, strings.Join(lines, "\n")+"\n", "-P", "-b", broker, "-t", "keys-kcat", "-K:", "-X", "partitioner=murmur2_random")
		if err := c.Publish(ctxT(t), "keys-omnibus", ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		where := func(topic string) map[string]string {
			out := runKcat(t, bin, "", "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k %p\n")
			m := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if k, p, ok := strings.Cut(line, " "); ok {
					m[k] = p
				}
			}
			return m
		}
		java, ours := where("keys-kcat"), where("keys-omnibus")
		used := map[string]bool{}
		for _, k := range keys {
			if java[k] == "" || java[k] != ours[k] {
				t.Errorf("key %q: murmur2 (kcat) partition %q, omnibus partition %q", k, java[k], ours[k])
			}
			used[ours[k]] = true
		}
		var parts []string
		for p := range used {
			parts = append(parts, p)
		}
		sort.Strings(parts)
		t.Logf("64 keys on partitions %v, identical for kcat (murmur2_random) and omnibus", parts)
	})
}
