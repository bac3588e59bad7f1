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

// probeWait bounds each look.
const probeWait = 500 * time.Millisecond

// protocol names what answers on a port.
type protocol string

const (
	protoNATS  protocol = "NATS"
	protoAMQP  protocol = "AMQP 0-9-1 (RabbitMQ)"
	protoKafka protocol = "plain Kafka"
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
	if u.Scheme == "kafka" && (q.Get("tls") == "true" || q.Has("tls_ca")) {
		want.proto = protoTLS
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
	hint := "is the port right? NATS listens on 4222, RabbitMQ on 5672, Kafka on 9092"
	switch {
	case want.proto == protoTLS && got == schemeSpeaks[want.switchTo].proto, got == protoTLS && want.switchTo != "":
		hint = "use " + want.switchTo + "://"
	}
	return fmt.Errorf("the server at %s speaks %s, not %s (%s)", host, got, want.proto, hint)
}

// probe looks at what answers on addr: a greeting it sends unasked
// (NATS), or an answer to a Kafka ApiVersions request, an AMQP protocol
// header or a TLS ClientHello, in that order; "" when nothing answers.
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
				return protocol(fmt.Sprintf("a protocol that greets with %q", b[:min(n, 16)]))
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
		func(c net.Conn) protocol { // a TLS handshake
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // only to see that TLS answers; nothing is sent over it
			if err := tc.HandshakeContext(ctx); err == nil {
				return protoTLS
			}
			return ""
		},
	}
	for _, fn := range looks {
		if p := look(fn); p != "" {
			return p
		}
	}
	return ""
}
