package redisbus

// Publishing: XADD of each message to its stream, pipelined in one round
// trip, WAIT for the replicas at durability all, and trimming at most
// once a second per stream. It runs on the caller's goroutine; conn.mu
// guards the replica count and the trim times.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// trimEvery is how often a connection trims a stream it publishes to.
const trimEvery = time.Second

// trimScan bounds the entries one trim looks at (see trimScript).
const trimScan = 10000

// replicasEvery is how often a connection reads the server's replica
// count for durability all.
const replicasEvery = time.Second

// Publish implements driver.Conn. A batch is one pipeline: an XADD per
// message (to the partition of its key on a partitioned topic), then,
// at durability all on a server with replicas, WAIT until every replica
// connected has the batch. A message that fails (a header the wire
// cannot carry, a key holding another type) fails alone.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	parts, err := c.layout(ctx, topic)
	if err != nil {
		return err
	}
	replicas := 0
	if opts.Durability == driver.DurabilityAll {
		replicas = c.replicaCount(ctx)
	}
	// WAIT waits for the writes of its own connection: with replicas to
	// wait for, the batch goes on a connection held for both.
	//
	// On a partitioned topic the batch is one transaction (MULTI/EXEC),
	// all of it stored or none: in a plain pipeline the server may refuse
	// the first commands and run the next ones (LOADING until a restarted
	// server has read its data, BUSY while a script runs), and the
	// messages published again would land behind newer ones of their key.
	var cn *redis.Conn
	var on interface {
		Pipeline() redis.Pipeliner
		TxPipeline() redis.Pipeliner
	} = c.rdb
	if replicas > 0 {
		cn = c.rdb.Conn()
		defer cn.Close()
		on = cn
	}
	pipe := on.Pipeline()
	if parts > 0 {
		pipe = on.TxPipeline()
	}
	errs := make([]error, len(msgs))
	cmds := make([]*redis.Cmd, len(msgs))
	streams := map[string]bool{}
	for i, m := range msgs {
		if errs[i] = checkHeaders(m); errs[i] != nil {
			continue
		}
		stream := streamKey(topic, c.partition(m.Key, parts))
		streams[stream] = true
		cmds[i] = pipe.Do(ctx, xadd(stream, m)...)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // errors are read per command
	}
	var wait *redis.IntCmd
	if replicas > 0 && len(streams) > 0 {
		wait = cn.Wait(ctx, replicas, c.cfg.waitTO)
	}
	var waitErr error
	if wait != nil {
		switch n, err := wait.Result(); {
		case err != nil:
			waitErr = fmt.Errorf("WAIT for %d replicas: %w", replicas, classify(err))
		case int(n) < replicas:
			waitErr = fmt.Errorf("WAIT: %d of %d replicas have the message after %v (it is on the primary)", n, replicas, c.cfg.waitTO)
		}
	}
	aborted := abortCause(cmds)
	failed := 0
	for i, cmd := range cmds {
		if cmd != nil {
			if err := cmd.Err(); err != nil {
				if aborted != nil && redis.HasErrorPrefix(err, "EXECABORT") {
					err = fmt.Errorf("the batch's transaction was discarded: %w", aborted)
				}
				errs[i] = classify(err)
			} else {
				errs[i] = waitErr
			}
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("redisbus: publish %q: %w", topic, errs[i])
			failed++
		}
	}
	if failed < len(msgs) {
		c.trim(ctx, streams)
	}
	switch {
	case failed == 0:
		return nil
	case len(msgs) == 1:
		return errs[0]
	}
	return &driver.MessageErrors{Errs: errs}
}

// partition returns the partition of key on a topic of parts partitions
// (-1: unpartitioned); keyless messages go round robin.
func (c *conn) partition(key string, parts int) int {
	switch {
	case parts == 0:
		return -1
	case key == "":
		return int(c.rr.Add(1) % uint64(parts))
	}
	return driver.Partition(key, parts)
}

// replicaCount returns the replicas connected to the server, read at
// most every replicasEvery (0 when it cannot be read).
func (c *conn) replicaCount(ctx context.Context) int {
	c.mu.Lock()
	n, at := c.replicas, c.replicaAt
	c.mu.Unlock()
	if time.Since(at) < replicasEvery {
		return n
	}
	info, err := c.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return n
	}
	_, _ = fmt.Sscan(infoField(info, "connected_slaves"), &n)
	c.mu.Lock()
	c.replicas, c.replicaAt = n, time.Now()
	c.mu.Unlock()
	return n
}

// trim runs trimScript on the streams published to, when the URL asks
// for trimming and the stream's last trim by this connection is
// trimEvery ago. A trim that fails is logged: the message landed.
func (c *conn) trim(ctx context.Context, streams map[string]bool) {
	if !c.cfg.trims() {
		return
	}
	now := time.Now()
	for stream := range streams {
		c.mu.Lock()
		due := now.Sub(c.trimmed[stream]) >= trimEvery
		if due {
			c.trimmed[stream] = now
		}
		c.mu.Unlock()
		if !due {
			continue
		}
		unread := "0"
		if c.cfg.trimUnread {
			unread = "1"
		}
		err := trimScript.Run(ctx, c.rdb, []string{stream}, c.cfg.maxLen, c.cfg.maxAge.Milliseconds(), unread, trimScan).Err()
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn("trim failed", "stream", stream, "err", err)
		}
	}
}

// abortCause returns why a batch's transaction was discarded: the first
// error the server gave a command of it as it queued it (LOADING, BUSY),
// which every command of the batch then shares; nil when none was
// discarded.
func abortCause(cmds []*redis.Cmd) error {
	aborted := false
	var cause error
	for _, cmd := range cmds {
		if cmd == nil {
			continue
		}
		switch err := cmd.Err(); {
		case err == nil:
		case redis.HasErrorPrefix(err, "EXECABORT"):
			aborted = true
		case cause == nil:
			cause = err
		}
	}
	if !aborted {
		return nil
	}
	return cause
}
