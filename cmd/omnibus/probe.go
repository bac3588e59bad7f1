package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
)

// A URL whose scheme does not match what listens on its port (kafkas://
// on a plain listener, nats:// on RabbitMQ's port) leaves a client
// waiting for an answer that never comes, or failing with a message about
// frame sizes. When opening takes longer than probeAfter, or fails, the
// command looks at what answers on the URL's first address, and when it
// is not what the scheme speaks, it stops waiting and says what it found.

// probeAfter is how long opening may take before the command looks.
const probeAfter = 500 * time.Millisecond

// probeWait bounds each look; the first that recognises the server ends
// the probe.
const probeWait = time.Second

// protocol names what answers on a port.
type protocol string

const (
	protoNATS  protocol = "NATS"
	protoAMQP  protocol = "AMQP 0-9-1 (RabbitMQ)"
	protoKafka protocol = "plain Kafka"
	protoRedis protocol = "Redis (RESP)"
	protoNSQ   protocol = "NSQ (TCP)"
	protoTLS   protocol = "TLS"
)

// schemeSpeaks is what a scheme expects on its port, with its default
// port, and the scheme that speaks the other side of TLS.
var schemeSpeaks = map[string]struct {
	proto    protocol
	port     string
	switchTo string // the scheme for a port that speaks the other side of TLS
}{
	"kafka":  {protoKafka, "9092", "kafkas"},
	"kafkas": {protoTLS, "9092", "kafka"},
	"amqp":   {protoAMQP, "5672", "amqps"},
	"amqps":  {protoTLS, "5671", "amqp"},
	"nats":   {protoNATS, "4222", ""},
	"redis":  {protoRedis, "6379", ""},
	"nsq":    {protoNSQ, "4150", ""},
}

// wrongProtocol returns an error saying what answers on raw's first
// address when it is not what raw's scheme speaks, or nil when it is, or
// when it cannot tell.
func wrongProtocol(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	want, ok := schemeSpeaks[u.Scheme]
	if !ok || u.Host == "" {
		return nil
	}
	q := u.Query()
	switch {
	case u.Scheme == "kafka" && (q.Get("tls") == "true" || q.Has("tls_ca")),
		u.Scheme == "redis" && (q.Get("tls") == "true" || q.Has("tls_ca")):
		want.proto = protoTLS
	case u.Scheme == "nsq" && (q.Get("lookup") == "true" || q.Get("tls") == "true" || q.Has("tls_ca")):
		return nil // nsqlookupd's HTTP API, or TLS negotiated inside NSQ's protocol
	}
	host, _, _ := strings.Cut(u.Host, ",")
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), want.port)
	}
	if host == "embedded:"+want.port {
		return nil
	}
	got := probe(ctx, host)
	if got == "" || got == want.proto {
		return nil
	}
	hint := "is the port right? NATS listens on 4222, RabbitMQ on 5672, Kafka on 9092, Redis on 6379, NSQ on 4150"
	switch {
	case want.proto == protoTLS && got == schemeSpeaks[want.switchTo].proto, got == protoTLS && want.switchTo != "":
		hint = "use " + want.switchTo + "://"
	}
	return fmt.Errorf("the server at %s speaks %s, not %s (%s)", host, got, want.proto, hint)
}

// probe looks at what answers on addr: a greeting it sends unasked
// (NATS), or an answer to a Kafka ApiVersions request, an AMQP protocol
// header, a Redis PING, an NSQ IDENTIFY or a TLS ClientHello, each on a
// connection of its own, the Kafka one first (so the probe takes twice
// probeWait at most), and names the first that recognises the server;
// "" when nothing answers.
func probe(ctx context.Context, addr string) protocol {
	look := func(fn func(net.Conn) protocol) protocol {
		d := net.Dialer{Timeout: probeWait}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return ""
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(probeWait))
		return fn(conn)
	}
	looks := []func(net.Conn) protocol{
		func(c net.Conn) protocol { // a greeting
			b := make([]byte, 64)
			n, _ := c.Read(b)
			switch {
			case bytes.HasPrefix(b[:n], []byte("INFO ")):
				return protoNATS
			case n > 0:
				return protocol(fmt.Sprintf("%s%q", greets, b[:min(n, 16)]))
			}
			return ""
		},
		func(c net.Conn) protocol { // Kafka ApiVersions v0, correlation ID 7
			const client = "omnibus-probe"
			req := binary.BigEndian.AppendUint32(nil, uint32(2+2+4+2+len(client)))
			req = binary.BigEndian.AppendUint16(req, 18) // ApiVersions
			req = binary.BigEndian.AppendUint16(req, 0)
			req = binary.BigEndian.AppendUint32(req, 7)
			req = binary.BigEndian.AppendUint16(req, uint16(len(client)))
			req = append(req, client...)
			if _, err := c.Write(req); err != nil {
				return ""
			}
			resp := make([]byte, 8)
			if _, err := io.ReadFull(c, resp); err == nil && binary.BigEndian.Uint32(resp[4:]) == 7 {
				return protoKafka
			}
			return ""
		},
		func(c net.Conn) protocol { // an AMQP 0-9-1 header: the server answers with connection.start
			if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
				return ""
			}
			frame := make([]byte, 7)
			if _, err := io.ReadFull(c, frame); err == nil && frame[0] == 1 && frame[1] == 0 && frame[2] == 0 {
				return protoAMQP
			}
			return ""
		},
		func(c net.Conn) protocol { // a Redis inline PING: +PONG, or an error (-NOAUTH ...) in RESP
			if _, err := c.Write([]byte("PING\r\n")); err != nil {
				return ""
			}
			b := make([]byte, 64)
			n, _ := io.ReadAtLeast(c, b, 7)
			line, _, ok := bytes.Cut(b[:n], []byte("\r\n"))
			if ok && (bytes.Equal(line, []byte("+PONG")) || bytes.HasPrefix(line, []byte("-NOAUTH ")) || bytes.HasPrefix(line, []byte("-WRONGPASS ")) ||
				bytes.HasPrefix(line, []byte("-NOPERM ")) || bytes.HasPrefix(line, []byte("-DENIED "))) {
				return protoRedis
			}
			return ""
		},
		func(c net.Conn) protocol { // NSQ's magic and an empty IDENTIFY: nsqd answers with a frame (OK)
			req := []byte("  V2IDENTIFY\n\x00\x00\x00\x02{}")
			if _, err := c.Write(req); err != nil {
				return ""
			}
			head := make([]byte, 8) // size, frame type (0 response, 1 error)
			if _, err := io.ReadFull(c, head); err != nil {
				return ""
			}
			size, kind := binary.BigEndian.Uint32(head), binary.BigEndian.Uint32(head[4:])
			if size < 6 || size > 1<<16 || kind > 1 {
				return ""
			}
			data := make([]byte, 2)
			if _, err := io.ReadFull(c, data); err == nil && (string(data) == "OK" || string(data) == "E_" || data[0] == '{') {
				return protoNSQ
			}
			return ""
		},
		func(c net.Conn) protocol { // a TLS handshake
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // only to see that TLS answers; nothing is sent over it
			if err := tc.HandshakeContext(ctx); err == nil {
				return protoTLS
			}
			return ""
		},
	}
	// Every look but an unknown greeting names one protocol, which no
	// other look mistakes for its own: the first of those is the answer.
	// The others start once the Kafka look has found no Kafka: a
	// Kafka-protocol server reads another look's first bytes as a
	// request's length, up to a gigabyte, and may allocate it (kfake
	// does), which delayed its answer, and the process, by seconds.
	found := make(chan protocol, len(looks))
	go func() { found <- look(looks[0]) }() // ends within probeWait (the dial's and the connection's deadline)
	if p := look(looks[1]); p != "" {
		return p
	}
	for _, fn := range looks[2:] {
		go func() { found <- look(fn) }()
	}
	var greeting protocol
	for range len(looks) - 1 {
		switch p := <-found; {
		case strings.HasPrefix(string(p), greets):
			greeting = p
		case p != "":
			return p
		}
	}
	return greeting
}

// greets starts the name of a protocol the probe does not know, which
// sent a greeting.
const greets = "a protocol that greets with "
