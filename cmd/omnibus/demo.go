package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/spf13/cobra"
)

type demoOptions struct {
	url         string
	orders      int
	customers   int
	consumers   int
	lanes       int
	poison      int
	concurrency int
	rate        float64
	work        time.Duration
	timeout     time.Duration
}

// demoMaxAttempts is how often a failing order is tried before it is
// dead-lettered.
const demoMaxAttempts = 3

func (a *app) demoCmd() *cobra.Command {
	o := demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch a consumer group process a stream of orders, then verify every one",
		Long: `demo runs the whole idea in about fifteen seconds, on the embedded default
transport unless --url names another:

  - a producer publishes --orders orders at --rate per second, keyed by
    customer, with a few poison orders among them (undecodable JSON, and
    one that always fails);
  - a consumer group handles them with a simulated, variable amount of
    work, in order per customer, starting with one consumer and scaling to
    --consumers when the lag builds up;
  - poison orders land in the dead-letter topic: the undecodable ones at
    once, the failing one after ` + fmt.Sprint(demoMaxAttempts) + ` attempts;
  - the screen shows throughput, lag per lane, consumers and dead letters.

It ends with a verified summary: every order processed, each customer's
orders handled in order, poison orders dead-lettered exactly once, nothing
lost. The exit status is 1 when a check fails. Ctrl-C stops it cleanly.
On a server (--url) the demo removes its topics and consumer groups when
it ends, however it ends; what the transport cannot remove, it names.`,
		Example: `  omnibus demo
  omnibus demo --orders 20000 --rate 2000 --consumers 4
  omnibus demo --url kafka://localhost:9092`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.demo(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.IntVar(&o.orders, "orders", 4000, "orders to publish, poison orders included")
	f.IntVar(&o.customers, "customers", 40, "customers (message keys)")
	f.IntVar(&o.consumers, "consumers", 3, "consumers to scale to once the lag builds up")
	f.IntVar(&o.lanes, "lanes", 8, "lanes of the orders topic")
	f.IntVar(&o.poison, "poison", 3, "poison orders among them (alternately undecodable and failing)")
	f.IntVar(&o.concurrency, "concurrency", 4, "orders one consumer handles at once")
	f.Float64Var(&o.rate, "rate", 400, "orders published per second (0: as fast as possible)")
	f.DurationVar(&o.work, "work", 12*time.Millisecond, "average simulated work per order")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "fail when processing is not done this long after the last publish")
	return cmd
}

func (o demoOptions) validate() error {
	switch {
	case o.orders < 1, o.customers < 1, o.consumers < 1, o.lanes < 1, o.concurrency < 1:
		return usagef("demo: --orders, --customers, --consumers, --lanes and --concurrency must be at least 1")
	case o.poison < 0 || o.poison >= o.orders:
		return usagef("demo: --poison %d: want 0 up to fewer than --orders", o.poison)
	case o.rate < 0 || o.work < 0 || o.timeout <= 0:
		return usagef("demo: --rate and --work must not be negative, --timeout must be positive")
	}
	return nil
}

// demo is one run.
type demo struct {
	o       demoOptions
	c       *omnibus.Client
	url     string
	topic   string
	dlq     string
	ordered bool
	led     *ledger
	start   time.Time

	published atomic.Int64
	retries   atomic.Int64
	events    eventLog
}

func (a *app) demo(ctx context.Context, o demoOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	c, scratch, done, err := a.openScratch(ctx, o.url)
	if err != nil {
		return err
	}
	defer done()
	run := shortID()
	d := &demo{
		o: o, c: c, url: a.urlName(),
		topic:   "demo.orders." + run,
		ordered: c.Capabilities().Ordered,
		led:     newLedger(),
	}
	d.dlq = d.topic + ".dlq"
	err = d.run(ctx, a, run)
	// On a server, what the run made goes with it; the consumers have
	// stopped.
	if scratch {
		return err
	}
	var left leftovers
	removeMade(ctx, c, []groupOn{{d.topic, "omnibus-demo-" + run}, {d.dlq, "omnibus-demo-dlq-" + run}}, []string{d.topic, d.dlq}, &left)
	if len(left) > 0 {
		w := a.stdout
		if err != nil {
			w = a.stderr
		}
		fmt.Fprintf(w, "left on the transport: %s\n", oneLine(omnibus.Redact(strings.Join(left, "; "), a.rawURL)))
	}
	return err
}

func (d *demo) run(ctx context.Context, a *app, run string) error {
	if err := d.c.CreateTopic(ctx, d.topic, d.o.lanes); err != nil {
		return err
	}
	if err := d.c.CreateTopic(ctx, d.dlq, 1); err != nil {
		return err
	}
	start := omnibus.StartLatest
	if d.c.Capabilities().Replay {
		start = omnibus.StartEarliest // fresh topics: nothing is missed while the groups form
	}
	ordering := omnibus.OrderNone
	if d.ordered {
		ordering = omnibus.OrderKey
	}
	k, err := d.c.Subscribe(ctx, d.topic, d.handle,
		omnibus.Group("omnibus-demo-"+run), omnibus.StartFrom(start), omnibus.Order(ordering),
		omnibus.MaxInFlight(d.o.concurrency), omnibus.MaxAttempts(demoMaxAttempts),
		omnibus.Backoff(100*time.Millisecond, 400*time.Millisecond),
		omnibus.DeadLetterTopic(d.dlq), omnibus.DrainTimeout(10*time.Second),
		omnibus.Observe(d.observe))
	if err != nil {
		return err
	}
	dk, err := d.c.Subscribe(ctx, d.dlq, func(_ context.Context, m *omnibus.Message) error {
		d.led.deadLettered(m)
		return nil
	}, omnibus.Group("omnibus-demo-dlq-"+run), omnibus.StartFrom(start))
	if err != nil {
		k.Close()
		return err
	}

	// Goroutines of the run, all ended before run returns: the two
	// consumers (Shutdown), the producer (its context), the scaler.
	d.start = time.Now()
	d.events.start = d.start
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	var wg sync.WaitGroup
	consumerErr := make(chan error, 2)
	for _, x := range []*omnibus.Consumer{k, dk} {
		wg.Go(func() {
			if err := x.Run(runCtx); err != nil {
				consumerErr <- err
			}
		})
	}
	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	prodDone := make(chan error, 1)
	wg.Go(func() { prodDone <- d.produce(prodCtx, run) })

	scr := newScreen(a.stdout, d, k)
	scr.header()
	failure := d.watch(ctx, k, scr, prodDone, consumerErr, &wg)

	// Stop: drain both consumers so nothing is left half-settled.
	lag := int64(-1)
	if failure == nil && ctx.Err() == nil {
		lag = d.settledLag(ctx, k)
	}
	cancelProd()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	serr := errors.Join(shutdown(sctx, k), shutdown(sctx, dk))
	cancelRun()
	wg.Wait()
	scr.final()

	if ctx.Err() != nil {
		processed, dead := d.led.counts()
		fmt.Fprintf(a.stdout, "\ninterrupted after %s: published %d, processed %d, dead-lettered %d; consumers drained and stopped\n",
			time.Since(d.start).Round(100*time.Millisecond), d.published.Load(), processed, dead)
		return errors.Join(errInterrupted, serr)
	}
	if failure != nil {
		return errors.Join(failure, serr)
	}
	if !d.summary(a, lag) {
		return errSilent
	}
	return serr
}

// watch refreshes the screen until the run is complete, fails, times out
// or is interrupted; it scales the group up once a third of the orders are
// out.
func (d *demo) watch(ctx context.Context, k *omnibus.Consumer, scr *screen, prodDone, consumerErr chan error, wg *sync.WaitGroup) error {
	tick := time.NewTicker(scr.period)
	defer tick.Stop()
	var (
		produced bool
		deadline <-chan time.Time
		scaled   = d.o.consumers == 1
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-consumerErr:
			return err
		case err := <-prodDone:
			if err != nil {
				return err
			}
			produced = true
			d.events.add("all %d orders published in %s", d.o.orders, time.Since(d.start).Round(100*time.Millisecond))
			t := time.NewTimer(d.o.timeout)
			defer t.Stop()
			deadline = t.C
		case <-deadline:
			processed, dead := d.led.counts()
			return fmt.Errorf("demo: not done %v after the last publish: processed %d of %d orders, dead-lettered %d of %d",
				d.o.timeout, processed, d.o.orders-d.o.poison, dead, d.o.poison)
		case <-tick.C:
		}
		if !scaled && d.published.Load() >= int64(d.o.orders)/3 {
			scaled = true
			from := k.Members()
			d.events.add("lag is building up: scaling consumers %d → %d", from, d.o.consumers)
			wg.Go(func() {
				if err := k.Scale(ctx, d.o.consumers); err != nil && ctx.Err() == nil && !errors.Is(err, omnibus.ErrClosed) {
					d.events.add("scaling failed: %v", err)
				}
			})
		}
		scr.draw(ctx)
		if produced && d.led.complete() {
			return nil
		}
	}
}

// settledLag waits briefly for the last commits and returns the total lag
// left, or -1 when the transport does not report lag.
func (d *demo) settledLag(ctx context.Context, k *omnibus.Consumer) int64 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		lags, err := k.Lag(lctx)
		cancel()
		if err != nil {
			return -1
		}
		total := int64(0)
		known := true
		for _, l := range lags {
			total += l.Lag
			known = known && l.Known
		}
		if (total == 0 && known) || time.Now().After(deadline) || ctx.Err() != nil {
			if !known {
				return -1
			}
			return total
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func shutdown(ctx context.Context, k *omnibus.Consumer) error {
	if err := k.Shutdown(ctx); err != nil && !errors.Is(err, omnibus.ErrClosed) {
		return err
	}
	return nil
}

// handle is the consumer's handler: decode, simulate work, record.
func (d *demo) handle(ctx context.Context, m *omnibus.Message) error {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return omnibus.Permanent(fmt.Errorf("undecodable order: %w", err))
	}
	if o.Cursed {
		return fmt.Errorf("order %s: the payment provider declines it, every time", o.ID)
	}
	t := time.NewTimer(d.workTime())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err() // not handled: the transport delivers it again
	}
	d.led.process(o)
	return nil
}

// workTime is a variable amount of simulated work: mostly short, now and
// then several times the average.
func (d *demo) workTime() time.Duration {
	if d.o.work == 0 {
		return 0
	}
	f := min(0.2+rand.ExpFloat64()*0.8, 8)
	return time.Duration(f * float64(d.o.work))
}

func (d *demo) observe(e omnibus.Event) {
	switch e.Kind {
	case omnibus.EventRetried:
		d.retries.Add(1)
	case omnibus.EventDeadLettered:
		d.events.add("dead-lettered %s (%s): %s", e.Message.ID, e.Message.Key, firstLine(e.Err))
	}
}

func firstLine(err error) string {
	s := oneLine(err.Error())
	if len(s) > 70 {
		s = s[:67] + "..."
	}
	return s
}

// produce publishes the orders at the configured rate, building each
// batch as it goes.
func (d *demo) produce(ctx context.Context, run string) error {
	poison := d.poisonPlan()
	const batchMax = 100
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < d.o.orders; {
		n := d.o.orders - i
		if d.o.rate > 0 {
			due := int(time.Since(d.start).Seconds() * d.o.rate)
			n = min(n, due-i)
		}
		n = min(n, batchMax)
		if n <= 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			continue
		}
		batch := make([]*omnibus.Message, n)
		for j := range batch {
			batch[j] = d.order(run, i+j, poison[i+j])
		}
		if err := d.c.Publish(ctx, d.topic, batch...); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("demo: publish: %w", err)
		}
		i += n
		d.published.Store(int64(i))
	}
	return nil
}

// poisonPlan spreads the poison orders evenly, alternately undecodable and
// failing.
func (d *demo) poisonPlan() map[int]string {
	at := map[int]string{}
	for p := range d.o.poison {
		kind := poisonUndecodable
		if p%2 == 1 {
			kind = poisonFailing
		}
		at[(p+1)*d.o.orders/(d.o.poison+1)] = kind
	}
	return at
}

// order builds order number i (from 0) for a random customer and notes
// it in the ledger: valid orders are numbered per customer from 1.
func (d *demo) order(run string, i int, poison string) *omnibus.Message {
	id := fmt.Sprintf("%s-%06d", run, i+1)
	customer := fmt.Sprintf("customer-%02d", rand.IntN(d.o.customers)+1)
	o := order{ID: id, Customer: customer, Amount: float64(rand.IntN(20000)) / 100}
	var body []byte
	switch poison {
	case poisonUndecodable:
		d.led.expectPoison(id, poison)
		body = []byte(`{"order":"` + id + `","customer":"` + customer + `","amount":`)
	case poisonFailing:
		d.led.expectPoison(id, poison)
		o.Cursed = true
		body, _ = json.Marshal(o)
	default:
		o.Seq = d.led.expect(id, customer)
		body, _ = json.Marshal(o)
	}
	return &omnibus.Message{ID: id, Key: customer, Type: "order.created", Source: "omnibus-demo", Body: body}
}

// summary prints the verified summary and reports whether every check
// passed.
func (d *demo) summary(a *app, lag int64) bool {
	checks := d.led.verify(d.ordered, demoMaxAttempts, lag)
	w := a.stdout
	fmt.Fprintf(w, "\nverified summary (%s, topic %s):\n", d.url, d.topic)
	ok := true
	for _, c := range checks {
		mark := "ok  "
		switch {
		case c.skip:
			mark = "skip"
		case !c.ok:
			mark = "FAIL"
			ok = false
		}
		fmt.Fprintf(w, "  %s  %-40s %s\n", mark, c.name, c.detail)
	}
	processed, _ := d.led.counts()
	elapsed := time.Since(d.start)
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s: %d orders in %s (%.0f orders/s), %d retries, consumers 1 → %d\n",
		verdict, d.o.orders, elapsed.Round(100*time.Millisecond), rate(processed, elapsed), d.retries.Load(), d.o.consumers)
	return ok
}

// eventLog keeps the last few notable events for the screen.
type eventLog struct {
	start time.Time // set before any event is added

	mu    sync.Mutex
	lines []string
	total int
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fmt.Sprintf("%5.1fs  %s", time.Since(l.start).Seconds(), strings.TrimSpace(fmt.Sprintf(format, args...)))
	l.lines = append(l.lines, line)
	l.total++
}

// since returns the events after the first n, and the new total.
func (l *eventLog) since(n int) ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[min(n, len(l.lines)):]...), l.total
}

// last returns the last n events.
func (l *eventLog) last(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[max(0, len(l.lines)-n):]...)
}
