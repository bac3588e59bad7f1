package natsbus

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzHeaders: a message with any headers and payload decodes without
// panic, and a message Publish takes (toMsg) crosses a real NATS server
// (nats.go's header encoding, the server, nats.go's decoding) and
// decodes to the message as its documented values are written
// (headerValue: CR and LF made spaces, white space at either end
// dropped). nats.go refusing the headers natsbus let through fails the
// target too.
func FuzzHeaders(f *testing.F) {
	fuzztest.SeedMessages(f)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		f.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		f.Fatal("the NATS server did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		f.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("fuzz.headers")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, key, typ, source, contentType string, nanos int64, hs string, body []byte) {
		h := nats.Header{}
		for _, kv := range fuzztest.Headers(hs) {
			h.Add(kv[0], kv[1])
		}
		fromMsg(&driver.Message{}, h, body)

		m := fuzztest.Message(id, key, typ, source, contentType, nanos, hs, body)
		nm, err := toMsg("fuzz.headers", m)
		if err != nil {
			return // Publish refuses it
		}
		if err := nc.PublishMsg(nm); err != nil {
			t.Fatalf("nats.go refuses what toMsg built: %v (headers %q)", err, nm.Header)
		}
		in, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("the message did not come back: %v", err)
		}
		var got driver.Message
		fromMsg(&got, in.Header, in.Data)
		want := *m
		want.ID, want.Key, want.Type, want.Source, want.ContentType =
			headerValue(m.ID), headerValue(m.Key), headerValue(m.Type), headerValue(m.Source), headerValue(m.ContentType)
		if m.Headers != nil {
			want.Headers = map[string]string{}
			for k, v := range m.Headers {
				want.Headers[k] = headerValue(v)
			}
		}
		fuzztest.Same(t, &want, &got)
	})
}
