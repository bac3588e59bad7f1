package console_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/dlq"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// backlog is the lag the tests give group billing: the orders published,
// the poison included.
const backlog = 120

// shop is the workload the page is tested on: topic orders with group
// billing, which stopped with a known backlog, and group shipping, which
// runs, handles every order but one (the poison, dead-lettered), and
// counts the poison's handlings once it comes back replayed.
type shop struct {
	topic    string
	poisonID string

	mu       sync.Mutex
	replayed int // the poison handled after its replay
}

func startShop(t *testing.T, ctx context.Context, c *omnibus.Client, topic string) *shop {
	t.Helper()
	s := &shop{topic: topic}
	if err := c.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	start := omnibus.StartLatest
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest
	}
	// billing: a group that exists and reads nothing more.
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil },
		omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartLatest))
	if err != nil {
		t.Fatal(err)
	}
	_ = k.Close()
	dead := make(chan struct{}, 1)
	k, err = c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		if m.Key != "poison" {
			return nil
		}
		if m.Headers[dlq.HeaderReplays] == "" {
			return omnibus.Permanent(errors.New("payment declined: card expired"))
		}
		s.mu.Lock()
		s.replayed++
		s.mu.Unlock()
		return nil
	}, omnibus.Group("shipping"), omnibus.StartFrom(start), omnibus.Observe(func(e omnibus.Event) {
		if e.Kind == omnibus.EventDeadLettered {
			select {
			case dead <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = k.Run(context.WithoutCancel(ctx)) }()
	t.Cleanup(func() { _ = k.Close(); <-done })
	var msgs []*omnibus.Message
	for i := range backlog - 1 { // and the poison
		msgs = append(msgs, &omnibus.Message{Key: fmt.Sprint("customer-", i%7), Type: "order.created",
			Body: fmt.Appendf(nil, `{"order":%d,"total":%d.99}`, i, 10+i%50)})
	}
	poison := &omnibus.Message{ID: "order-4711", Key: "poison", Type: "order.created", ContentType: "application/json",
		Headers: map[string]string{"tenant": "acme"}, Body: []byte(`{"order":4711,"card":"expired","lines":[{"sku":"X-1","qty":2}]}`)}
	msgs = append(msgs[:backlog/2], append([]*omnibus.Message{poison}, msgs[backlog/2:]...)...)
	if err := c.Publish(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	s.poisonID = poison.ID
	select {
	case <-dead:
	case <-ctx.Done():
		t.Fatal("the poison was not dead-lettered")
	}
	return s
}

func (s *shop) replays() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replayed
}

// chromium finds the browser, or skips (fails in CI).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.SkipOrFail(t, "missing browser", "chromium is not installed; apt-get install chromium (scripts/test.sh does)")
	return ""
}

// artifacts is where screenshots go: $OMNIBUS_ARTIFACTS, else a
// temporary directory of the test's.
func artifacts(t *testing.T) string {
	if dir := os.Getenv("OMNIBUS_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// TestBrowser opens the console in headless Chromium on membus and on
// RabbitMQ, each with a known backlog and a known dead letter: the page
// shows the lagging group's figures and the dead letter's reason and
// body; replaying it from the page hands it back to the running
// consumer once, and the page then shows no dead letter. Screenshots
// are saved (OMNIBUS_ARTIFACTS, or the test's temporary directory).
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	dir := artifacts(t)
	for _, tr := range observetest.Transports {
		if tr.Name != "membus" && tr.Name != "rabbitmq" {
			continue
		}
		t.Run(tr.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			ns := observetest.Namespace()
			raw := tr.URL(t, ns)
			c := observetest.Open(t, raw)
			s := startShop(t, ctx, c, ns+".orders")

			url := serve(t, console.Options{
				Sources:  []console.Source{{URL: raw, Topics: []string{s.topic}, Groups: []string{"billing", "shipping"}}},
				Interval: 500 * time.Millisecond, AllowReplay: true,
			})

			base := browser(t, exe)
			shot := func(name string) {
				sctx, cancel := context.WithTimeout(base, 10*time.Second)
				defer cancel()
				png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
				if err != nil {
					t.Fatalf("screenshot: %v", err)
				}
				p := filepath.Join(dir, tr.Name+"-"+name+".png")
				if err := os.WriteFile(p, png, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("screenshot %s", p)
			}
			billingLag := `tr[data-test=group][data-group=billing] td[data-test=lag]`
			row := fmt.Sprintf(`tr[data-test=dead-letter][data-id=%q]`, s.poisonID)
			bctx, cancelB := context.WithTimeout(base, 45*time.Second)
			defer cancelB()
			err := chromedp.Do(bctx,
				chromedp.Navigate(url),
				waitText(billingLag, fmt.Sprint(backlog)),
				chromedp.WaitVisible(row),
			)
			if err != nil {
				shot("failed")
				t.Fatalf("the page did not show the backlog and the dead letter: %v", err)
			}
			reason, err := chromedp.Run(bctx, chromedp.Text(row+` td.reason`))
			if err != nil || !strings.Contains(reason, "card expired") {
				t.Errorf("the dead letter's reason %q (%v), want the handler's error", reason, err)
			}
			err = chromedp.Do(bctx,
				click(`tr[data-test=group][data-group=billing]`),
				chromedp.WaitVisible(`tr[data-test=lane]`),
				click(row),
				chromedp.WaitVisible(`pre[data-test=body]`),
			)
			if err != nil {
				shot("failed")
				t.Fatal(err)
			}
			body, err := chromedp.Run(bctx, chromedp.Text(`pre[data-test=body]`))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(body, "\"card\": \"expired\"") {
				t.Errorf("the body, shown as indented JSON: %q", body)
			}
			shot("dead-letter")

			// Replay from the page; it asks to confirm, and the test says yes.
			err = chromedp.Do(bctx,
				chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
					_, err := chromedp.Evaluate[bool](`window.confirm = () => true, true`)(ctx, t)
					return err
				}),
				click(`button[data-test=replay]`),
				chromedp.WaitVisible(`div[data-test=job][data-state=done]`),
				waitText(`[data-test=dlq-count]`, "0 dead letters"),
			)
			if err != nil {
				shot("failed")
				t.Fatalf("the replay from the page: %v", err)
			}
			observetest.Eventually(t, 10*time.Second, func() error {
				if n := s.replays(); n != 1 {
					return fmt.Errorf("the poison was handled %d times after its replay, want once", n)
				}
				return nil
			})
			shot("replayed")
		})
	}
}

// TestUnreachable: a source that cannot be reached is shown as such, with
// its error and no password, and is tried again.
func TestUnreachable(t *testing.T) {
	exe := chromium(t)
	var tries atomic.Int64
	url := serve(t, console.Options{Sources: []console.Source{{
		URL: "amqp://guest:s3cret@127.0.0.1:1/", Topics: []string{"orders"}, Groups: []string{"billing"},
		Open: func(ctx context.Context) (*omnibus.Client, error) {
			tries.Add(1)
			return nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused (amqp://guest:s3cret@127.0.0.1:1/)")
		}}}})
	bctx, cancelB := context.WithTimeout(browser(t, exe), 20*time.Second)
	defer cancelB()
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`[data-test=unreachable]`)); err != nil {
		t.Fatal(err)
	}
	banner, err := chromedp.Run(bctx, chromedp.Text(`[data-test=unreachable]`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(banner, "connection refused") || !strings.Contains(banner, "Retrying") || strings.Contains(banner, "s3cret") {
		t.Errorf("banner %q: want the error, Retrying, no password", banner)
	}
	observetest.Eventually(t, 10*time.Second, func() error {
		if n := tries.Load(); n < 2 {
			return fmt.Errorf("opened %d times, want it tried again", n)
		}
		return nil
	})
}

// browser starts headless Chromium for the test.
func browser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 900), chromedp.Flag("headless", "new"))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// click clicks the first element matching sel once there is one, in the
// page: the page renders itself again at each update, so a node found
// by the protocol may be gone by the time it is clicked.
func click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true; })()`, sel)
		for {
			ok, err := chromedp.Evaluate[bool](js)(ctx, t)
			if err != nil || ok {
				return err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("click %s: %w", sel, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

// waitText waits until the first element matching sel has text want.
func waitText(sel, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			got, err := chromedp.Text(sel, chromedp.NodeVisible)(qctx, t)
			cancel()
			if err == nil && strings.TrimSpace(got) == want {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: text %q, want %q (%v)", sel, got, want, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}
