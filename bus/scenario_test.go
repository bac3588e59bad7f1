package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The scenario's messages. Each carries its order as its key.
type (
	OrderPlaced struct {
		Order string `json:"order"`
		Total int    `json:"total"`
	}
	ChargeCard struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	Charged struct {
		Order   string `json:"order"`
		Receipt string `json:"receipt"`
	}
	PaymentCaptured struct {
		Order string `json:"order"`
	}
)

func (m OrderPlaced) MessageKey() string     { return m.Order }
func (m ChargeCard) MessageKey() string      { return m.Order }
func (m Charged) MessageKey() string         { return m.Order }
func (m PaymentCaptured) MessageKey() string { return m.Order }

// scenarioOrders is the number of orders per transport, and why fewer
// where it is fewer.
var scenarioOrders = map[string]int{
	"membus": 10000, "kafka": 10000, "rabbitmq": 10000, "nats": 10000, "nats-embedded": 10000, "redis": 10000, "nsq": 10000,
}

// Which orders fail, and how.
func transient(i int) bool { return i%97 == 5 }  // billing fails their first attempt
func permanent(i int) bool { return i%101 == 3 } // billing declines them: dead letter
func requested(i int) bool { return i%10 == 0 }  // sent with Request, not Send

// ledger counts what each service saw, by order.
type ledger struct {
	mu           sync.Mutex
	charged      map[string]int    // billing: successful ChargeCard handlings
	commandID    map[string]string // billing: the ChargeCard's message ID
	attempts     map[string]int    // billing: every ChargeCard attempt
	billingSaw   map[string]int    // billing: OrderPlaced
	shippingSaw  map[string]int    // shipping: OrderPlaced (batches)
	captured     map[string]int    // shipping: PaymentCaptured
	capturedBy   map[string]string // shipping: PaymentCaptured's causation ID
	replies      map[string]int    // orders: replies to Send, by order
	replyWrong   []string          // replies that reached an instance that did not send them, or lost their correlation
	requestsOK   map[string]int    // orders: Request answered with Charged
	requestFault map[string]int    // orders: Request answered with a fault
	sentBy       map[string]string // orders: the instance that sent the order's command
	problems     []string
}

func newLedger() *ledger {
	return &ledger{
		charged: map[string]int{}, commandID: map[string]string{}, attempts: map[string]int{},
		billingSaw: map[string]int{}, shippingSaw: map[string]int{}, captured: map[string]int{},
		capturedBy: map[string]string{}, replies: map[string]int{}, requestsOK: map[string]int{},
		requestFault: map[string]int{}, sentBy: map[string]string{},
	}
}

func (l *ledger) problem(format string, args ...any) {
	l.mu.Lock()
	if len(l.problems) < 20 {
		l.problems = append(l.problems, fmt.Sprintf(format, args...))
	}
	l.mu.Unlock()
}

func orderNo(order string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(order, "o"))
	return n
}

// TestScenario runs the same three services on every transport: the
// order service sends commands (some with Request), billing handles them
// (failing some transiently and some permanently), replies and publishes
// events, and shipping subscribes to the events of both.
func TestScenario(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ns := namespace()
			scenario(t, tr.url(t, ns), ns, scenarioOrders[tr.name])
		})
	}
}

func scenario(t *testing.T, rawURL, ns string, orders int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l := newLedger()
	fast := bus.Subscribe(omnibus.Backoff(20*time.Millisecond, 200*time.Millisecond))

	// The dead-letter topic of billing's commands, read from the start.
	namer, err := bus.New(transporttest.Open(t, rawURL), "namer", bus.Namespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	deadLettered := deadLetters(t, ctx, transporttest.Open(t, rawURL), namer.CommandTopic("billing"))

	// Billing: two instances, one group.
	var billings []*bus.Bus
	for range 2 {
		b, err := bus.New(transporttest.Open(t, rawURL), "billing", bus.Namespace(ns), fast)
		if err != nil {
			t.Fatal(err)
		}
		must(t, bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, c ChargeCard) error {
			i := orderNo(c.Order)
			l.mu.Lock()
			l.attempts[c.Order]++
			first := l.attempts[c.Order] == 1
			l.mu.Unlock()
			if inv.Message().Key != c.Order {
				l.problem("ChargeCard %s has key %q", c.Order, inv.Message().Key)
			}
			if transient(i) && first {
				return errors.New("card processor busy")
			}
			if permanent(i) {
				return omnibus.Permanent(fmt.Errorf("card declined for order %s", c.Order))
			}
			if err := inv.Reply(ctx, Charged{Order: c.Order, Receipt: "r-" + c.Order}); err != nil {
				return err
			}
			if err := b.Publish(ctx, PaymentCaptured{Order: c.Order}); err != nil {
				return err
			}
			l.mu.Lock()
			l.charged[c.Order]++
			l.commandID[c.Order] = inv.ID()
			l.mu.Unlock()
			return nil
		}))
		must(t, bus.HandleEvent(b, "orders", func(ctx context.Context, inv bus.Invocation, e OrderPlaced) error {
			l.mu.Lock()
			l.billingSaw[e.Order]++
			l.mu.Unlock()
			return nil
		}))
		billings = append(billings, b)
	}

	// Shipping: events of orders (in batches) and of billing.
	shipping, err := bus.New(transporttest.Open(t, rawURL), "shipping", bus.Namespace(ns), fast,
		bus.SubscribeEvents("orders", omnibus.Batch(50, 1<<20, 20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	must(t, bus.HandleEventBatch(shipping, "orders", func(ctx context.Context, items []bus.Item[OrderPlaced]) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, it := range items {
			l.shippingSaw[it.Value.Order]++
		}
		return nil
	}))
	must(t, bus.HandleEvent(shipping, "billing", func(ctx context.Context, inv bus.Invocation, e PaymentCaptured) error {
		l.mu.Lock()
		l.captured[e.Order]++
		l.capturedBy[e.Order] = inv.CausationID()
		l.mu.Unlock()
		if inv.CorrelationID() != inv.CausationID() {
			l.problem("PaymentCaptured %s: correlation %q, want the command's ID %q", e.Order, inv.CorrelationID(), inv.CausationID())
		}
		return nil
	}))

	// Orders: two instances sending; each counts the replies it gets.
	var ordersBus []*bus.Bus
	for range 2 {
		b, err := bus.New(transporttest.Open(t, rawURL), "orders", bus.Namespace(ns), fast)
		if err != nil {
			t.Fatal(err)
		}
		must(t, bus.HandleReply(b, func(ctx context.Context, inv bus.Invocation, r Charged) error {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.replies[r.Order]++
			if l.sentBy[r.Order] != b.Instance() || inv.CausationID() != inv.CorrelationID() || inv.CausationID() == "" {
				l.replyWrong = append(l.replyWrong, r.Order)
			}
			return nil
		}))
		ordersBus = append(ordersBus, b)
	}

	begin := time.Now()
	for _, b := range append(append(billings, shipping), ordersBus...) {
		start(t, ctx, b)
	}
	t.Logf("started 6 instances in %v", time.Since(begin).Round(time.Millisecond))

	// Send: 16 senders over the order numbers; orders in chunks of 50.
	begin = time.Now()
	var wg sync.WaitGroup
	const senders, chunk = 16, 50
	errs := make(chan error, senders)
	for s := range senders {
		b := ordersBus[s%2]
		wg.Go(func() {
			for lo := s * chunk; lo < orders; lo += senders * chunk {
				var placed, cmds []any
				for i := lo; i < min(lo+chunk, orders); i++ {
					o := "o" + strconv.Itoa(i)
					l.mu.Lock()
					l.sentBy[o] = b.Instance()
					l.mu.Unlock()
					placed = append(placed, OrderPlaced{Order: o, Total: i})
					if requested(i) {
						request(ctx, b, l, o, i)
						continue
					}
					cmds = append(cmds, ChargeCard{Order: o, Amount: i})
				}
				if err := b.Publish(ctx, placed...); err != nil {
					errs <- err
					return
				}
				if err := b.Send(ctx, "billing", cmds...); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("send: %v", err)
	}
	sent := time.Since(begin)

	// Everything arrives.
	nPermanent := 0
	for i := range orders {
		if permanent(i) {
			nPermanent++
		}
	}
	missing := func() error {
		deads := deadLettered()
		l.mu.Lock()
		defer l.mu.Unlock()
		var miss []string
		count := func(what string, n int) {
			if n > 0 {
				miss = append(miss, fmt.Sprintf("%d %s", n, what))
			}
		}
		var charged, replies, requests, billingSaw, shippingSaw, captured int
		for i := range orders {
			o := "o" + strconv.Itoa(i)
			if l.billingSaw[o] == 0 {
				billingSaw++
			}
			if l.shippingSaw[o] == 0 {
				shippingSaw++
			}
			if permanent(i) {
				if requested(i) && l.requestFault[o] == 0 {
					requests++
				}
				continue
			}
			if l.charged[o] == 0 {
				charged++
			}
			if l.captured[o] == 0 {
				captured++
			}
			if requested(i) && l.requestsOK[o] == 0 {
				requests++
			}
			if !requested(i) && l.replies[o] == 0 {
				replies++
			}
		}
		count("commands not handled", charged)
		count("replies to Send not received", replies)
		count("Requests not answered", requests)
		count("OrderPlaced not seen by billing", billingSaw)
		count("OrderPlaced not seen by shipping", shippingSaw)
		count("PaymentCaptured not seen by shipping", captured)
		count("dead letters missing", nPermanent-len(deads))
		if len(miss) > 0 {
			return errors.New(strings.Join(miss, ", "))
		}
		return nil
	}
	eventually(t, 3*time.Minute, missing)
	done := time.Since(begin)

	// Check what arrived.
	time.Sleep(200 * time.Millisecond) // let a late duplicate show
	deads := deadLettered()
	l.mu.Lock()
	defer l.mu.Unlock()
	dups := map[string]int{}
	for i := range orders {
		o := "o" + strconv.Itoa(i)
		dups["ChargeCard handled"] += max(0, l.charged[o]-1)
		dups["OrderPlaced at billing"] += max(0, l.billingSaw[o]-1)
		dups["OrderPlaced at shipping"] += max(0, l.shippingSaw[o]-1)
		dups["PaymentCaptured at shipping"] += max(0, l.captured[o]-1)
		dups["replies"] += max(0, l.replies[o]-1)
		if permanent(i) && l.charged[o] > 0 {
			t.Errorf("order %s was to be declined, and was charged", o)
		}
		if transient(i) && !permanent(i) && l.attempts[o] < 2 {
			t.Errorf("order %s was to fail once, and was tried %d time(s)", o, l.attempts[o])
		}
		if l.charged[o] > 0 && l.capturedBy[o] != l.commandID[o] {
			t.Errorf("PaymentCaptured of %s: causation %q, want the ChargeCard's ID %q", o, l.capturedBy[o], l.commandID[o])
		}
	}
	for order, reasons := range deads {
		if !permanent(orderNo(order)) {
			t.Errorf("dead letter of order %q, which was not to fail permanently (reasons %q)", order, reasons)
		}
		for _, r := range reasons {
			if !strings.Contains(r, "card declined for order "+order) {
				t.Errorf("dead letter of %s: reason %q, want the handler's error", order, r)
			}
		}
		dups["dead letters"] += len(reasons) - 1
	}
	if len(l.replyWrong) > 0 {
		t.Errorf("%d replies reached the wrong instance or lost their correlation, first %v", len(l.replyWrong), l.replyWrong[:min(5, len(l.replyWrong))])
	}
	for _, p := range l.problems {
		t.Error(p)
	}
	var stats []string
	var late, timeouts int64
	for _, b := range append(append(billings, shipping), ordersBus...) {
		s := b.Stats()
		late += s.LateReplies
		timeouts += s.Timeouts
		stats = append(stats, fmt.Sprintf("%s %+v", b.Service(), s))
	}
	if timeouts > 0 {
		t.Errorf("%d Requests timed out", timeouts)
	}
	var dupList []string
	for what, n := range dups {
		if n > 0 {
			dupList = append(dupList, fmt.Sprintf("%s %d", what, n))
		}
	}
	t.Logf("%d orders (%d by Request, %d declined, transient failures on %d): sent in %v, all handled %v after the first send; duplicates: %s; late replies %d",
		orders, orders/10, nPermanent, orders/97, sent.Round(time.Millisecond), done.Round(time.Millisecond), orNone(dupList), late)
	for _, s := range stats {
		t.Log(s)
	}
}

// request sends order o with Request and records the answer.
func request(ctx context.Context, b *bus.Bus, l *ledger, o string, i int) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := bus.Request[Charged](rctx, b, "billing", ChargeCard{Order: o, Amount: i})
	var fault *bus.FaultError
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil && r.Order == o:
		l.requestsOK[o]++
	case err == nil:
		l.problems = append(l.problems, fmt.Sprintf("Request %s answered with the reply of %s", o, r.Order))
	case errors.As(err, &fault) && permanent(i) && strings.Contains(fault.Reason, "card declined for order "+o) && fault.Service == "billing":
		l.requestFault[o]++
	default:
		l.problems = append(l.problems, fmt.Sprintf("Request %s: %v", o, err))
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
