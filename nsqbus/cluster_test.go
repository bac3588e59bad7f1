package nsqbus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestTwoNSQDs runs a group over two nsqds, in both modes: listed in the
// URL, and found through nsqlookupd. Publishing goes to both in turn,
// the group reads both (its channel made on each before it connects),
// and the lag adds both up.
func TestTwoNSQDs(t *testing.T) {
	l := nsqtest.StartLookupd(t)
	a := nsqtest.StartNSQD(t, nsqtest.Config{Lookupd: l})
	b := nsqtest.StartNSQD(t, nsqtest.Config{Lookupd: l})
	for mode, u := range map[string]string{
		"direct": "nsq://" + a.TCPAddr() + "," + b.TCPAddr() + "?" + testParams,
		"lookup": "nsq://" + l.HTTPAddr() + "?lookup=true&" + testParams,
	} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			topic := fmt.Sprintf("two-%s-%x", mode, rand.Uint32())
			c := transporttest.Open(t, u)
			if mode == "lookup" {
				// Both nsqds registered, so the group is made on both.
				transporttest.Eventually(t, 10*time.Second, func() bool { return len(lookupNodes(t, l)) == 2 },
					func() string { return fmt.Sprintf("nsqlookupd knows %v, want both nsqds", lookupNodes(t, l)) })
			}
			col := newCollector()
			stuck := make(chan struct{})
			k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
				if string(m.Body) == "stuck" {
					<-stuck
				}
				return col.handle(ctx, m)
			}, omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)
			t.Cleanup(func() { close(stuck) })
			var ids []string
			for i := 0; i < 1000; i += 100 {
				ms := numbered(topic, i, 100, 10)
				if err := c.Publish(ctx, topic, ms...); err != nil {
					t.Fatal(err)
				}
				for _, m := range ms {
					ids = append(ids, m.ID)
				}
			}
			awaitAll(t, 30*time.Second, ids, col)
			for _, n := range []*nsqtest.NSQD{a, b} {
				if got := messageCount(t, n, topic); got < 100 {
					t.Errorf("nsqd %s took %d of 1000 messages; publishing should alternate", n.TCPAddr(), got)
				}
			}
			// Two messages held by the handler, one on each nsqd (at least
			// one per nsqd goes to each, in turn): the lag counts both.
			stuckMsgs := []*omnibus.Message{{Body: []byte("stuck")}, {Body: []byte("stuck")}}
			for _, m := range stuckMsgs {
				if err := c.Publish(ctx, topic, m); err != nil {
					t.Fatal(err)
				}
			}
			var lags []omnibus.LaneLag
			transporttest.Eventually(t, 10*time.Second, func() bool {
				lags, _ = k.Lag(ctx)
				return len(lags) == 1 && lags[0].Known && lags[0].Lag == 2
			}, func() string { return fmt.Sprintf("lag %+v, want 2 over the two nsqds", lags) })
		})
	}
}

// lookupNodes lists the nsqds registered with l.
func lookupNodes(t *testing.T, l *nsqtest.Lookupd) []string {
	var resp struct {
		Producers []struct {
			TCPPort int `json:"tcp_port"`
		} `json:"producers"`
	}
	getJSON(t, l.HTTPAddr(), "/nodes", &resp)
	var ports []string
	for _, p := range resp.Producers {
		ports = append(ports, fmt.Sprint(p.TCPPort))
	}
	return ports
}

// messageCount is how many messages n's topic has taken.
func messageCount(t *testing.T, n *nsqtest.NSQD, topic string) int {
	var st struct {
		Topics []struct {
			Name  string `json:"topic_name"`
			Count int    `json:"message_count"`
		} `json:"topics"`
	}
	getJSON(t, n.HTTPAddr(), "/stats?format=json&topic="+topic, &st)
	for _, tp := range st.Topics {
		if tp.Name == topic {
			return tp.Count
		}
	}
	return 0
}

func getJSON(t *testing.T, addr, path string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}
