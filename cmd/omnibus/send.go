package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/spf13/cobra"
)

type sendOptions struct {
	url     string
	topic   string
	key     string
	typ     string
	headers []string
	count   int
	size    int
	keys    int
	batch   int
}

func (a *app) sendCmd() *cobra.Command {
	var o sendOptions
	cmd := &cobra.Command{
		Use:   "send --topic T [--key K] [--header k=v ...]",
		Short: "Publish one message per line of standard input, or generated messages",
		Long: `send publishes one message per line of standard input (without the line
ending), or, with --count, that many generated messages of --size bytes,
keyed over --keys distinct keys. It ends with a summary line: messages sent
(confirmed by the transport), failed (refused: they did not land),
unconfirmed (the publish ended before the transport answered: they may
have landed), retried (publishes tried again with the same IDs after the
transport lost its connection or did not answer, as during a broker
restart: they count as sent once confirmed), not sent, and the rate. On Ctrl-C it starts no new batch
and waits up to 5s for the one in flight. On a terminal, large counts
show a progress bar.`,
		Example: `  echo '{"id":1}' | omnibus send --topic orders --key customer-7 --header kind=test
  omnibus send --topic orders < orders.jsonl
  omnibus send --url nats://localhost:4222 --topic load --count 100000 --size 512 --keys 64`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.send(cmd.Context(), cmd, o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic to publish to (required)")
	f.StringVar(&o.key, "key", "", "key of every message")
	f.StringVar(&o.typ, "type", "", "type of every message (CloudEvents type)")
	f.StringArrayVar(&o.headers, "header", nil, "header k=v (repeatable)")
	f.IntVar(&o.count, "count", 0, "generate this many messages instead of reading standard input")
	f.IntVar(&o.size, "size", 100, "body size in bytes of generated messages")
	f.IntVar(&o.keys, "keys", 0, "spread generated messages over this many keys (0: no key)")
	f.IntVar(&o.batch, "batch", 100, "messages per publish call")
	return cmd
}

func (o *sendOptions) validate(cmd *cobra.Command) (map[string]string, error) {
	if o.topic == "" {
		return nil, usagef("send: --topic is required")
	}
	if o.batch < 1 {
		return nil, usagef("send: --batch %d: want at least 1", o.batch)
	}
	if o.count < 0 || o.size < 0 || o.keys < 0 {
		return nil, usagef("send: --count, --size and --keys must not be negative")
	}
	if o.count == 0 && (cmd.Flags().Changed("size") || cmd.Flags().Changed("keys")) {
		return nil, usagef("send: --size and --keys generate messages and need --count")
	}
	if o.keys > 0 && o.key != "" {
		return nil, usagef("send: use --key or --keys, not both")
	}
	var h map[string]string
	for _, kv := range o.headers {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("send: --header %q: want key=value", kv)
		}
		if h == nil {
			h = map[string]string{}
		}
		h[k] = v
	}
	return h, nil
}

// sendStats counts what send did with each message.
type sendStats struct {
	sent        int        // the transport confirmed them
	failed      int        // the transport refused them: they did not land
	unconfirmed int        // the publish ended without an answer: they may have landed
	retried     retryCount // messages published again
	firstErr    error
	start       time.Time
}

// retryCount is a publish-retry hook that counts the messages a client
// publishes again after an error (a broker restarting, a leader moving,
// an answer cut off): a command rides through them and says how many
// there were, as each may have landed twice.
type retryCount struct{ atomic.Int64 }

// OnPublishRetry implements omnibus.PublishRetryHook.
func (r *retryCount) OnPublishRetry(p omnibus.PublishRetry) { r.Add(int64(len(p.IDs))) }

// sendGrace is how long a publish in flight may still take after Ctrl-C,
// so that send learns whether its messages landed.
const sendGrace = 5 * time.Second

// add counts the outcome of publishing n messages.
func (st *sendStats) add(n int, err error) {
	var pe *omnibus.PublishError
	switch {
	case err == nil:
		st.sent += n
		return
	case errors.As(err, &pe):
		for _, f := range pe.Failed {
			if unanswered(f.Err) {
				st.unconfirmed++
			} else {
				st.failed++
			}
		}
		st.sent += n - len(pe.Failed)
	case unanswered(err):
		st.unconfirmed += n
	default:
		st.failed += n
	}
	if st.firstErr == nil {
		st.firstErr = err
	}
}

// unanswered reports whether a publish error leaves the fate of its
// messages unknown: the call ended (Ctrl-C, a deadline, a lost
// connection) before the transport answered. Errors that stop a message
// before it is sent (invalid, too large, closed client) are not.
func unanswered(err error) bool {
	for _, sure := range []error{omnibus.ErrInvalid, omnibus.ErrTooLarge, omnibus.ErrClosed, omnibus.ErrUnsupported} {
		if errors.Is(err, sure) {
			return false
		}
	}
	var pe *omnibus.PublishError
	return !errors.As(err, &pe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// summary is send's last line of standard output.
func (st *sendStats) summary(topic string, notSent int) string {
	elapsed := time.Since(st.start)
	s := fmt.Sprintf("sent %d, failed %d", st.sent, st.failed)
	if st.unconfirmed > 0 {
		s += fmt.Sprintf(", unconfirmed %d", st.unconfirmed)
	}
	if n := st.retried.Load(); n > 0 {
		s += fmt.Sprintf(", retried %d", n)
	}
	if notSent > 0 {
		s += fmt.Sprintf(", not sent %d", notSent)
	}
	return s + fmt.Sprintf(", %.0f msgs/s (%s to %q)", rate(st.sent, elapsed), elapsed.Round(time.Millisecond), topic)
}

// outcome explains how send ended, or nil when every message was sent.
// notSent is -1 when send cannot know (the rest of standard input).
func (st *sendStats) outcome(interrupted bool, notSent int) error {
	var parts []string
	if st.failed > 0 {
		parts = append(parts, fmt.Sprintf("%d message(s) failed", st.failed))
	}
	if st.unconfirmed > 0 {
		parts = append(parts, fmt.Sprintf("%d message(s) unconfirmed: they may have landed, check before sending them again", st.unconfirmed))
	}
	switch {
	case notSent > 0:
		parts = append(parts, fmt.Sprintf("%d message(s) not sent", notSent))
	case notSent < 0:
		parts = append(parts, "the rest of standard input was not sent")
	}
	msg := "send"
	if len(parts) > 0 {
		msg += ": " + strings.Join(parts, "; ")
	}
	switch {
	case interrupted:
		return fmt.Errorf("%s: %w", msg, errInterrupted)
	case st.firstErr != nil:
		return fmt.Errorf("%s: %w", msg, st.firstErr)
	}
	return nil
}

func (a *app) send(ctx context.Context, cmd *cobra.Command, o sendOptions) error {
	headers, err := o.validate(cmd)
	if err != nil {
		return err
	}
	st := &sendStats{}
	c, err := a.open(ctx, o.url, omnibus.WithHooks(&st.retried))
	if err != nil {
		return err
	}
	defer a.closeClient(c)
	a.noteProcessLocal()

	// Ctrl-C stops send from starting a batch; the batch in flight gets
	// sendGrace to be answered.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(sendGrace, cancel) })
	defer stopGrace()

	st.start = time.Now()
	bar := newProgress(a.stderr, o.count)
	attempted := 0
	publish := func(batch []*omnibus.Message) error {
		err := c.Publish(pctx, o.topic, batch...)
		attempted += len(batch)
		st.add(len(batch), err)
		bar.update(attempted)
		var pe *omnibus.PublishError
		if err != nil && !errors.As(err, &pe) {
			return err // the transport is gone, or ctx ended
		}
		return nil
	}
	newMsg := func(key string, body []byte) *omnibus.Message {
		m := &omnibus.Message{Key: key, Type: o.typ, Body: body}
		if headers != nil {
			m.Headers = make(map[string]string, len(headers))
			for k, v := range headers {
				m.Headers[k] = v
			}
		}
		return m
	}

	var loopErr error
	if o.count > 0 {
		loopErr = sendGenerated(ctx, o, newMsg, publish)
	} else {
		loopErr = sendLines(ctx, a.stdin, o, newMsg, publish)
	}
	bar.done()
	notSent := 0
	switch {
	case o.count > 0:
		notSent = o.count - attempted
	case loopErr != nil && (ctx.Err() != nil || loopErr == st.firstErr):
		notSent = -1
	}
	fmt.Fprintln(a.stdout, st.summary(o.topic, max(notSent, 0)))
	if loopErr != nil && ctx.Err() == nil && loopErr != st.firstErr {
		return loopErr // reading standard input failed
	}
	return st.outcome(ctx.Err() != nil, notSent)
}

func sendGenerated(ctx context.Context, o sendOptions, newMsg func(string, []byte) *omnibus.Message, publish func([]*omnibus.Message) error) error {
	batch := make([]*omnibus.Message, 0, o.batch)
	for i := range o.count {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		key := o.key
		if o.keys > 0 {
			key = "key-" + strconv.Itoa(i%o.keys)
		}
		batch = append(batch, newMsg(key, generatedBody(i, o.size)))
		if len(batch) == o.batch || i == o.count-1 {
			if err := publish(batch); err != nil {
				return err
			}
			batch = make([]*omnibus.Message, 0, o.batch)
		}
	}
	return nil
}

// generatedBody is size bytes: the message's number, then dots.
func generatedBody(i, size int) []byte {
	b := make([]byte, size)
	n := copy(b, strconv.Itoa(i)+" ")
	for j := n; j < size; j++ {
		b[j] = '.'
	}
	return b
}

// sendLines publishes a message per line of r. A batch is published when
// it is full or when no more input is waiting, so interactive input goes
// out line by line.
func sendLines(ctx context.Context, r io.Reader, o sendOptions, newMsg func(string, []byte) *omnibus.Message, publish func([]*omnibus.Message) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var batch []*omnibus.Message
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = trimEOL(line)
			batch = append(batch, newMsg(o.key, line))
		}
		if len(batch) > 0 && (len(batch) >= o.batch || br.Buffered() == 0 || err != nil) {
			if perr := publish(batch); perr != nil {
				return perr
			}
			batch = nil
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("send: read standard input: %w", err)
		}
	}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// progress draws a bar on a terminal for large counts; elsewhere it does
// nothing.
type progress struct {
	w     io.Writer
	total int
	last  time.Time
	drawn bool
}

const progressMin = 10000 // counts below this finish too fast for a bar

func newProgress(w io.Writer, total int) *progress {
	if total < progressMin || !isTerminal(w) {
		return &progress{}
	}
	return &progress{w: w, total: total}
}

func (p *progress) update(n int) {
	if p.w == nil || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.drawn = true
	const width = 40
	fill := width * n / p.total
	fmt.Fprintf(p.w, "\r[%s%s] %3d%% %d/%d", strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*n/p.total, n, p.total)
}

func (p *progress) done() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
