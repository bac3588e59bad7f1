package nsqbus

// Subscribing: a group member (sub) is a go-nsq Consumer of the group's
// channel; its handler moves messages into the member's buffer, and
// Receive hands the buffer to the engine's fetch loop. Close stops the
// consumer and hands back what the member holds. sub.mu guards the
// buffer and the held set.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus/driver"
)

// lane is the one lane of a channel: NSQ has no order to keep.
const lane = "0"

// maxRdy is nsqd's default --max-rdy-count, the most messages a
// consumer can have in flight per connection.
const maxRdy = 2500

// sub is one group member.
//
// Goroutines: go-nsq's (its handler goroutine calls HandleMessage, its
// connections' read and write loops send FIN, REQ and TOUCH), and the
// keeper (TOUCH for what the member holds). Close ends them all.
type sub struct {
	c       *conn
	topic   string // the omnibus topic
	nsqTop  string // its NSQ topic
	channel string
	cb      driver.Lanes
	cons    *nsq.Consumer

	// Receive's own: calls never overlap.
	carry []*driver.Delivery // decoded, did not fit in the last Receive

	maxMsgs  int // the engine's MaxInFlight
	maxBytes int // and MaxInFlightBytes

	mu     sync.Mutex
	avg    int                        // bytes per message received, a moving average (0 before the first)
	window int                        // the consumer's max in flight (RDY over its connections)
	buf    []*nsq.Message             // received, not yet taken by Receive
	held   map[*nsq.Message]time.Time // received and not answered: when last received or touched
	closed bool
	wake   chan struct{}

	stop      chan struct{} // closed by Close: ends the keeper
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ driver.Acker     = (*sub)(nil)
	_ driver.Nacker    = (*sub)(nil)
	_ driver.LagReader = (*sub)(nil)
)

// Subscribe implements driver.Conn. It creates the group's channel on
// every nsqd that holds the topic (lookup mode: every nsqd when none
// does yet) before it connects, so that a message published after
// Subscribe returns reaches the group.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	fail := func(err error) (driver.Subscriber, error) {
		return nil, fmt.Errorf("nsqbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	if opts.StartAt == driver.StartEarliest {
		return fail(fmt.Errorf("a new channel cannot start from the earliest message: %w", driver.ErrUnsupported))
	}
	nsqTop, err := topicName(topic)
	if err != nil {
		return fail(err)
	}
	channel, err := channelName(opts.Group, opts.Ephemeral)
	if err != nil {
		return fail(err)
	}
	nodes, err := c.nodes(ctx, nsqTop)
	if err == nil && len(nodes) == 0 {
		nodes, err = c.nodes(ctx, "")
	}
	if err != nil {
		return fail(err)
	}
	for _, n := range nodes {
		q := url.Values{"topic": {nsqTop}}
		err := c.post(ctx, n.http, "/topic/create", q)
		if err == nil {
			q.Set("channel", channel)
			err = c.post(ctx, n.http, "/channel/create", q)
		}
		if err != nil {
			return fail(fmt.Errorf("create the channel on nsqd %s: %w", n.http, err))
		}
	}
	// go-nsq reads an answer's size without a bound: each nsqd is
	// checked before the consumer is given its address (check.go).
	for _, n := range nodes {
		if err := c.checkNSQD(ctx, n.tcp); err != nil {
			return fail(fmt.Errorf("nsqd %s: %w", n.tcp, err))
		}
	}
	s := &sub{
		c: c, topic: topic, nsqTop: nsqTop, channel: channel, cb: opts.Lanes,
		maxMsgs: min(max(opts.MaxInFlight, 1), maxRdy), maxBytes: max(opts.MaxInFlightBytes, 1),
		held: map[*nsq.Message]time.Time{}, wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	s.avg = guessBytes
	s.window = s.windowFor(s.avg)
	cfg := c.nsqConfig()
	cfg.MaxInFlight = 0 // opened below, once connected
	cons, err := nsq.NewConsumer(nsqTop, channel, cfg)
	if err != nil {
		return fail(fmt.Errorf("%v: %w", err, driver.ErrInvalid))
	}
	cons.SetLogger(c.nsqLogger(), nsq.LogLevelWarning)
	// go-nsq's own client for nsqlookupd keeps connections that nothing
	// closes after Stop; one without keep-alives keeps none.
	cons.SetLookupdHttpClient(&http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: c.cfg.dialTO}).DialContext},
		Timeout:   c.cfg.dialTO + 10*time.Second,
	})
	s.cons = cons
	cons.AddHandler(s)
	if !c.subs.Add(s) {
		cons.Stop()
		return fail(driver.ErrClosed)
	}
	if c.cfg.lookup {
		err = cons.ConnectToNSQLookupds(c.cfg.hosts)
	} else {
		tcp := make([]string, len(nodes))
		for i, n := range nodes {
			tcp[i] = n.tcp
		}
		err = cons.ConnectToNSQDs(tcp)
	}
	if err != nil {
		_ = s.Close()
		return fail(c.clientError(err))
	}
	// The consumer connects with a window of 0 and opens it once every
	// nsqd is connected: go-nsq gives a connection made while the others
	// hold the whole window RDY 0 and tries again 5 seconds later, so
	// with several nsqds one of them would wait that long for its first
	// message. Opened now, the window is spread over them all at once.
	s.mu.Lock()
	window := s.window
	s.mu.Unlock()
	cons.ChangeMaxInFlight(window)
	opts.Lanes.Claimed([]string{lane})
	s.wg.Add(1)
	go s.keep()
	return s, nil
}

// HandleMessage implements go-nsq's Handler, on go-nsq's handler
// goroutine: it buffers the message and holds it (the keeper touches
// it from now on). It does nothing more, so that go-nsq's connections,
// which wait for it, read on: a message nsqd sent is in flight, and
// times out, whether or not it was read.
func (s *sub) HandleMessage(m *nsq.Message) error {
	m.DisableAutoResponse()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		m.RequeueWithoutBackoff(0)
		return nil
	}
	s.held[m] = time.Now()
	s.buf = append(s.buf, m)
	window := s.adaptLocked(len(m.Body))
	s.mu.Unlock()
	driver.Notify(s.wake)
	if window > 0 {
		s.cons.ChangeMaxInFlight(window)
	}
	return nil
}

// guessBytes is the message size assumed before the first messages:
// the average starts there, so one small message does not open the
// window wide for large ones behind it.
const guessBytes = 64 << 10

// windowFor is how many messages of size bytes fit in the engine's
// bounds.
func (s *sub) windowFor(size int) int {
	return min(s.maxMsgs, max(1, s.maxBytes/max(size, 1)))
}

// adaptLocked folds a message of size bytes into the average, and
// returns the consumer's new max in flight when the messages' size
// moved it by a quarter or more, else 0. nsqd sends as many messages as
// the max in flight, whatever their size, and each starts timing out
// when it is sent: the window keeps what is sent within the engine's
// byte bound too, so that large messages do not wait in the socket
// until they time out.
func (s *sub) adaptLocked(size int) int {
	s.avg += (size - s.avg) / 8
	w := s.windowFor(s.avg)
	if w == s.window || (w > s.window*3/4 && w < s.window*5/4 && w != s.maxMsgs) {
		return 0
	}
	s.window = w
	return w
}

// delivery decodes a message into a delivery.
func delivery(m *nsq.Message) *driver.Delivery {
	d := &driver.Delivery{Lane: lane, Position: string(m.ID[:]), Attempt: int(m.Attempts), Token: m}
	if !decodeBinary(m.Body, &d.Message) && !decode(m.Body, &d.Message) {
		// Neither envelope: a producer other than omnibus.
		d.Message = driver.Message{ID: string(m.ID[:]), Time: time.Unix(0, m.Timestamp), Body: m.Body}
	}
	return d
}

// Receive implements driver.Subscriber. It decodes at most room.Count
// messages of the buffer, outside the lock, and returns what of them
// fits in room; the rest is first in line for the next call.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	if len(s.carry) == 0 {
		ms, err := s.take(ctx, room.Count)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			s.carry = append(s.carry, delivery(m))
		}
	}
	n, bytes := 0, 0
	for ; n < len(s.carry); n++ {
		size := s.carry[n].Size()
		if !room.Fits(n, bytes, size) {
			break
		}
		bytes += size
	}
	if n == 0 {
		return nil, nil // the first waiting does not fit
	}
	out := make([]*driver.Delivery, n)
	copy(out, s.carry)
	clear(s.carry[:n])
	s.carry = s.carry[n:]
	if len(s.carry) == 0 {
		s.carry = nil
	}
	return out, nil
}

// take waits for the buffer to hold messages and takes up to most of
// them.
func (s *sub) take(ctx context.Context, most int) ([]*nsq.Message, error) {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("nsqbus: receive %q: %w", s.topic, driver.ErrClosed)
		}
		if len(s.buf) > 0 {
			out := driver.Shift(&s.buf, min(len(s.buf), max(most, 1)))
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// stopWait bounds how long Close waits for go-nsq's connections to
// close once everything is answered (an nsqd that does not answer CLS).
const stopWait = 5 * time.Second

// Close implements driver.Subscriber. It stops the consumer (CLS: nsqd
// sends nothing more) and hands back at once (REQ without delay)
// everything the member holds unanswered, what the engine abandoned and
// what waits in the buffer or was decoded and not taken, so the group's other members get it now
// rather than after msg_timeout.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		held := s.held
		s.held, s.buf = nil, nil
		s.mu.Unlock()
		driver.Notify(s.wake)
		close(s.stop)
		s.cons.Stop()
		for m := range held {
			m.RequeueWithoutBackoff(0)
		}
		select {
		case <-s.cons.StopChan:
		case <-time.After(stopWait):
			s.c.log.Warn("nsqd did not close the consumer's connections in time", "topic", s.nsqTop, "channel", s.channel)
		}
		s.wg.Wait()
		s.c.subs.Remove(s)
	})
	return nil
}
