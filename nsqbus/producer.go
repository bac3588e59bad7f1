package nsqbus

// A producer publishes to one nsqd over a go-nsq Conn. nsqd answers the
// commands of a connection in order, so a queue of pending commands
// matches each answer (OK, or an error) to its command, and concurrent
// Publish calls pipeline on one connection. It dials on first use and
// after the connection drops.
//
// go-nsq's own Producer is not used: it races with itself when it
// reconnects (its router reads the connection that the next dial
// writes) and can panic on an answer after a drop (go-nsq issue 345).
//
// Locks: wmu serializes the writers (dialing, queueing and writing a
// command), so the queue's order is the order on the wire; mu guards the
// connection, the queue and each queued command's write state (an
// answer waits for its command's write to return), and is never held
// across I/O, so the connection's reader (go-nsq calls OnResponse,
// OnError and OnClose on the connection's goroutines) takes answers off
// the queue while a writer waits on a full socket. Order: wmu, mu.

import (
	"context"
	"fmt"
	"sync"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus/driver"
)

// errLost is the answer of a command whose connection closed before
// nsqd answered: nsqd may or may not have stored its messages, so it is
// marked driver.ErrOutcomeUnknown (omnibus.Publish sends them again,
// with the same IDs).
var errLost = fmt.Errorf("connection to nsqd lost before its answer; the messages may or may not be stored: %w", driver.ErrOutcomeUnknown)

type producer struct {
	c    *conn
	addr string

	wmu sync.Mutex

	mu      sync.Mutex
	nc      *nsq.Conn // nil while not connected
	pending []*command
	refused bool // nsqd answered an error on nc, and closes it: what follows was not run
	closed  bool
}

// command is a PUB or MPUB waiting for its answer.
//
// Its answer goes on done only once its write has returned, though
// nsqd may answer (or the connection close) before: the caller reuses
// the command's bytes as soon as it has the answer, and the write, on
// another goroutine when OnClose sends the command again, may still be
// reading them. Under mu, writing says a write is under way, and early
// holds an answer that came meanwhile.
type command struct {
	cmd      *nsq.Command
	done     chan error // the answer; buffered
	writing  bool
	answered bool
	early    error
}

func newProducer(c *conn, addr string) *producer {
	return &producer{c: c, addr: addr}
}

// connect returns the connection, dialing nsqd (IDENTIFY, and AUTH
// with the secret) when there is none, once checkNSQD, bounded by ctx,
// found that the server speaks NSQ. The caller holds wmu.
func (p *producer) connect(ctx context.Context) (*nsq.Conn, error) {
	p.mu.Lock()
	nc, closed := p.nc, p.closed
	p.mu.Unlock()
	switch {
	case closed:
		return nil, driver.ErrClosed
	case nc != nil:
		return nc, nil
	}
	if err := p.c.checkNSQD(ctx, p.addr); err != nil {
		return nil, err
	}
	nc = nsq.NewConn(p.addr, p.c.nsqConfig(), p)
	nc.SetLogger(p.c.nsqLogger(), nsq.LogLevelWarning, "(%s)")
	if _, err := nc.Connect(); err != nil {
		_ = nc.Close()
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = nc.Close()
		return nil, driver.ErrClosed
	}
	p.nc, p.refused = nc, false
	return nc, nil
}

// send writes cmd and returns the channel its answer comes on. An error
// means nothing was sent: the producer is closed, or nsqd could not be
// reached (connecting is bounded by ctx).
func (p *producer) send(ctx context.Context, cmd *nsq.Command) (<-chan error, error) {
	c := &command{cmd: cmd, done: make(chan error, 1)}
	if err := p.write(ctx, c); err != nil {
		return nil, err
	}
	return c.done, nil
}

func (p *producer) write(ctx context.Context, c *command) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for {
		nc, err := p.connect(ctx)
		if err != nil {
			return err
		}
		p.mu.Lock()
		current := p.nc == nc
		if current {
			p.pending = append(p.pending, c)
			c.writing = true
		}
		p.mu.Unlock()
		if !current {
			continue // the connection closed meanwhile (OnClose): dial again
		}
		// A failed write closes the connection (go-nsq calls
		// OnIOError); the command is answered with the others from
		// OnClose.
		_ = nc.WriteCommand(c.cmd)
		p.mu.Lock()
		c.writing = false
		answered, err := c.answered, c.early
		c.answered, c.early = false, nil
		p.mu.Unlock()
		if answered {
			c.done <- err
		}
		return nil
	}
}

// deliver hands c its answer, or, while c's write is under way, leaves
// it for the writer to hand on.
func (p *producer) deliver(c *command, err error) {
	p.mu.Lock()
	if c.writing {
		c.answered, c.early = true, err
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.done <- err
}

// answer hands the oldest pending command of nc its answer.
func (p *producer) answer(nc *nsq.Conn, err error) {
	p.mu.Lock()
	if p.nc != nc || len(p.pending) == 0 {
		p.mu.Unlock()
		return
	}
	c := p.pending[0]
	p.pending[0] = nil
	p.pending = p.pending[1:]
	if err != nil {
		p.refused = true
	}
	p.mu.Unlock()
	p.deliver(c, err)
}

// OnResponse implements nsq.ConnDelegate: OK to the oldest command.
func (p *producer) OnResponse(nc *nsq.Conn, data []byte) {
	if string(data) == "OK" {
		p.answer(nc, nil)
	}
}

// OnError implements nsq.ConnDelegate: nsqd refused the oldest command.
// Every refusal of PUB and MPUB is fatal to the connection: nsqd closes
// it and runs nothing sent after.
func (p *producer) OnError(nc *nsq.Conn, data []byte) {
	p.answer(nc, nsq.ErrProtocol{Reason: string(data)})
}

// OnIOError implements nsq.ConnDelegate: the connection is closed, and
// OnClose follows.
func (p *producer) OnIOError(nc *nsq.Conn, _ error) { _ = nc.Close() }

// OnClose implements nsq.ConnDelegate. The commands still pending get
// errLost, except those after a refusal: nsqd did not run them, so they
// go again on a new connection. (Each round of sending again follows a
// refusal, whose command got its answer, so the rounds end.)
func (p *producer) OnClose(nc *nsq.Conn) {
	p.mu.Lock()
	if p.nc != nc {
		p.mu.Unlock()
		return
	}
	pending, refused := p.pending, p.refused
	p.nc, p.pending = nil, nil
	p.mu.Unlock()
	for _, c := range pending {
		if !refused {
			p.deliver(c, errLost)
			continue
		}
		// Bounded by the dial timeout: the caller's ctx is gone.
		if err := p.write(context.Background(), c); err != nil {
			c.done <- fmt.Errorf("sending again a command nsqd did not run: %w", err)
		}
	}
}

// The rest of nsq.ConnDelegate concerns consumers.
func (p *producer) OnMessage(*nsq.Conn, *nsq.Message)         {}
func (p *producer) OnMessageFinished(*nsq.Conn, *nsq.Message) {}
func (p *producer) OnMessageRequeued(*nsq.Conn, *nsq.Message) {}
func (p *producer) OnBackoff(*nsq.Conn)                       {}
func (p *producer) OnContinue(*nsq.Conn)                      {}
func (p *producer) OnResume(*nsq.Conn)                        {}
func (p *producer) OnHeartbeat(*nsq.Conn)                     {}

var _ nsq.ConnDelegate = (*producer)(nil)

// close stops the producer and closes its connection: commands still
// pending get errLost (or their answer, if it comes first).
func (p *producer) close() {
	p.mu.Lock()
	p.closed = true
	nc := p.nc
	p.mu.Unlock()
	if nc != nil {
		_ = nc.Close()
	}
}
