package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
)

var consoleURL = regexp.MustCompile(`http://[^ \n]+/`)

// TestConsoleCommand: omnibus console serves the page and the state of a
// group with a known backlog on mem://, read-only by default, and ends
// on Ctrl-C with exit 0.
func TestConsoleCommand(t *testing.T) {
	raw, c := memURL(t, "?partitions=2")
	ctx := ctxT(t)
	k, err := c.Subscribe(ctx, "orders", func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("billing"))
	if err != nil {
		t.Fatal(err)
	}
	_ = k.Close()
	for i := range 30 {
		if err := c.Publish(ctx, "orders", &omnibus.Message{Key: fmt.Sprint(i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	r := runAsync(t, "console", "--url", raw, "--topic", "orders", "--group", "billing", "--addr", "127.0.0.1:0", "--interval", "100ms")
	var base string
	eventually(t, 30*time.Second, func() error {
		if base = consoleURL.FindString(r.stdout.String()); base == "" {
			return fmt.Errorf("no URL printed yet: %q %q", r.stdout.String(), r.stderr.String())
		}
		return nil
	})
	if !strings.Contains(r.stdout.String(), "read-only") {
		t.Errorf("stdout %q: want it to say read-only", r.stdout.String())
	}
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if page := get(""); !strings.Contains(page, "<title>omnibus console</title>") {
		t.Errorf("page: %.200s", page)
	}
	eventually(t, 30*time.Second, func() error {
		var st struct {
			Sources []struct {
				Groups []struct {
					Group string
					Total int64
					Known bool
				}
			}
		}
		body := get("api/state")
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		if g := st.Sources[0].Groups[0]; g.Group != "billing" || !g.Known || g.Total != 30 {
			return fmt.Errorf("state %s: want billing with a lag of 30", body)
		}
		return nil
	})
	if code := r.stop(t); code != exitOK {
		t.Errorf("exit %d after Ctrl-C, want 0; stderr %s", code, r.stderr.String())
	}
}

// TestConsoleUsage: flags the console refuses.
func TestConsoleUsage(t *testing.T) {
	raw, _ := memURL(t, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"console", "--url", raw}, "--topic is required"},
		{[]string{"console", "--url", raw, "--topic", "t", "--token", "x"}, "--allow-replay"},
		{[]string{"console", "--url", raw, "--topic", "t", "--target-lag", "0"}, "--target-lag"},
	} {
		r := runCmd(t, ctxT(t), nil, "", c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, r.code, r.stderr, exitUsage, c.want)
		}
	}
}

// TestKafkaOwners: the console's owners of a Kafka group's partitions are
// its members, read with kadm.
func TestKafkaOwners(t *testing.T) {
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	raw := "kafka://" + strings.Join(cl.ListenAddrs(), ",") + "?heartbeat_interval=100ms&fetch_max_wait=100ms"
	ctx := ctxT(t)
	c, err := omnibus.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	go k.Run(ctx)
	owners := ownersOf(raw)
	eventually(t, 30*time.Second, func() error {
		got, err := owners(ctx, c, "orders", "billing")
		if err != nil || len(got) != 2 || got["0"] == "" || got["0"] != got["1"] {
			return fmt.Errorf("owners %v, %v; want one member holding partitions 0 and 1", got, err)
		}
		return nil
	})
	if ownersOf("amqp://127.0.0.1/") != nil {
		t.Error("owners for RabbitMQ, which cannot tell them")
	}
}
