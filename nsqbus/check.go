package nsqbus

// The check of a server before go-nsq is given its address. go-nsq
// reads the size of an answer and allocates it without a bound, and
// waits for that many bytes: another protocol's first bytes, read as a
// size, are hundreds of megabytes ("-ERR", Redis's answer, is 759 MB; a
// NATS greeting's "INFO" 1.2 GB), held for up to go-nsq's read timeout
// of a minute. So every connection nsqbus has go-nsq make is preceded by
// one of its own, bounded in time and in what it reads. It runs on its
// caller's goroutine.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// maxCheckAnswer bounds the frame the check reads: nsqd answers the
// check's IDENTIFY with "OK" (a frame of 6 bytes), and any IDENTIFY
// with at most a few hundred.
const maxCheckAnswer = 64 << 10

// checkIdentify is NSQ's magic and an IDENTIFY without feature
// negotiation, which nsqd answers with OK.
var checkIdentify = []byte("  V2IDENTIFY\n\x00\x00\x00\x02{}")

// notNSQD is what the check says of a server that answered, not in NSQ,
// with what it answered: a configuration error, which trying again does
// not mend.
func notNSQD(answer string) error {
	return fmt.Errorf("the server does not speak NSQ: its answer to IDENTIFY begins %s (is the address nsqd's TCP port, 4150 by default?): %w", answer, driver.ErrInvalid)
}

// checkNSQD connects to addr, sends NSQ's magic and an IDENTIFY, and
// reads the answer, at most maxCheckAnswer bytes, within the dial
// timeout and ctx. A server whose answer is not an NSQ frame fails with
// an error wrapping driver.ErrInvalid (notNSQD) that quotes the
// answer's first bytes; one that does not answer in time fails with an
// error wrapping the network's timeout, or ctx's error.
func (c *conn) checkNSQD(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.dialTO)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) }) // ctx canceled before its deadline
	defer stop()
	fail := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if _, err := nc.Write(checkIdentify); err != nil {
		return fail("send IDENTIFY", err)
	}
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(nc, buf, 4)
	switch {
	case n > 0 && n < 4:
		return notNSQD(fmt.Sprintf("%q", buf[:n]))
	case err != nil:
		return fail("no answer to IDENTIFY", err)
	}
	size := binary.BigEndian.Uint32(buf)
	if size < 4 || size > maxCheckAnswer {
		return notNSQD(fmt.Sprintf("%q, read as a frame of %d bytes", buf[:min(n, 32)], size))
	}
	frame := buf[:n]
	if want := 4 + int(size); n < want {
		frame = append(make([]byte, 0, want), frame...)[:want]
		if _, err := io.ReadFull(nc, frame[n:]); err != nil {
			return fail("the answer to IDENTIFY", err)
		}
	}
	kind, data := binary.BigEndian.Uint32(frame[4:]), frame[8:min(len(frame), 4+int(size))]
	switch {
	case kind == 0 && (string(data) == "OK" || len(data) > 0 && data[0] == '{'):
		return nil
	case kind == 1:
		return fmt.Errorf("nsqd refused IDENTIFY: %s", data[:min(len(data), 200)])
	}
	return notNSQD(fmt.Sprintf("%q", frame[:min(len(frame), 32)]))
}
