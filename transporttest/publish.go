package transporttest

// Messages as published: what a message carries through the transport
// (every field and header, bodies of every shape up to 1 MiB) and what
// Publish refuses, per message. The tests run on the test's goroutine;
// handlers record into a collector, which its mutex guards.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func (s *suite) testRoundTrip(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("rt"))...)
	stop := RunConsumer(t, k)
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
	want := &omnibus.Message{
		ID:      "id-" + strconv.FormatUint(rand.Uint64(), 36),
		Key:     "customer-42",
		Type:    "order.created",
		Source:  "/omnibus/test",
		Time:    when,
		Headers: map[string]string{"a": "1", "trace-id": "abc def", "unicode": "é✓"},
		Body:    []byte(`{"order":1}`),
	}
	want.ContentType = "application/json"
	if err := pub.Publish(ctxT(t), topic, want); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	Eventually(t, timeout, func() bool { return col.unique() == 1 }, func() string { return "message not received" })
	stop()
	got := col.msgs[want.ID]
	if got == nil {
		t.Fatalf("received IDs %v, want %q", slices.Collect(maps.Keys(col.ids)), want.ID)
	}
	if got.Key != want.Key || got.Type != want.Type || got.Source != want.Source || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("got key=%q type=%q source=%q body=%q\nwant key=%q type=%q source=%q body=%q",
			got.Key, got.Type, got.Source, got.Body, want.Key, want.Type, want.Source, want.Body)
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("time: got %v, want %v", got.Time, want.Time)
	}
	if got.ContentType != want.ContentType {
		t.Errorf("content type: got %q, want %q", got.ContentType, want.ContentType)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			t.Errorf("header %q: got %q, want %q (all: %v)", k, got.Headers[k], v, got.Headers)
		}
	}
	if got.Topic != topic || got.Lane == "" || got.Attempt != 1 {
		t.Errorf("delivery fields: topic=%q lane=%q attempt=%d; want topic %q, a lane, attempt 1", got.Topic, got.Lane, got.Attempt, topic)
	}
}

func (s *suite) testBodies(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	bodies := map[string][]byte{
		"empty":    {},
		"binary":   {0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0x00},
		"oneKiB":   bytes.Repeat([]byte("ab"), 512),
		"unicode":  []byte("zażółć gęślą jaźń ✓"),
		"oneMiB":   nil,
		"trailing": []byte("line\n\r\n\x00"),
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if max := pub.Capabilities().MaxMessageBytes; max == 0 || max >= len(big)+4096 {
		bodies["oneMiB"] = big
	} else {
		delete(bodies, "oneMiB")
		t.Logf("SKIP 1 MiB body (capability MaxMessageBytes = %d)", max)
	}
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, earliest(sub)...)
	stop := RunConsumer(t, k)
	ids := map[string]string{}
	for name, b := range bodies {
		m := &omnibus.Message{Body: bytes.Clone(b), Headers: map[string]string{"body": name}}
		if err := pub.Publish(ctxT(t), topic, m); err != nil {
			t.Fatalf("Publish %s body: %v", name, err)
		}
		ids[name] = m.ID
		// The message is the caller's again: what landed must not change
		// with it.
		for i := range m.Body {
			m.Body[i] ^= 0xff
		}
		m.Headers["body"] = "written over"
	}
	Eventually(t, timeout, func() bool { return col.unique() == len(bodies) }, func() string {
		return fmt.Sprintf("received %d of %d bodies", col.unique(), len(bodies))
	})
	stop()
	for name, id := range ids {
		if got := col.msgs[id].Body; !bytes.Equal(got, bodies[name]) {
			t.Errorf("%s body: got %d bytes %.32q, want %d bytes %.32q", name, len(got), got, len(bodies[name]), bodies[name])
		}
		if got := col.msgs[id].Headers["body"]; got != name {
			t.Errorf("%s body: header %q, want %q", name, got, name)
		}
	}
}

func (s *suite) testPublishErrors(t *testing.T) {
	c := s.open(t)
	topic := s.topic(t, c)
	max := c.Capabilities().MaxMessageBytes
	if max == 0 {
		t.Skip("SKIP (capability MaxMessageBytes): the transport declares no size limit")
	}
	ms := []*omnibus.Message{{Body: []byte("ok1")}, {Body: make([]byte, max+1)}, {Body: []byte("ok2")}}
	err := c.Publish(ctxT(t), topic, ms...)
	var pe *omnibus.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish with an oversized message: got %v, want a *PublishError", err)
	}
	if len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrTooLarge) {
		t.Fatalf("failures %+v, want only index 1 failing with ErrTooLarge", pe.Failed)
	}
}

// testPublisher: the asynchronous Publisher, from one goroutine, in
// batches small enough that many are in flight at once: every message
// lands once, each key's in the order given (where lanes are ordered),
// and an oversized message fails alone with ErrTooLarge.
func (s *suite) testPublisher(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, earliest(sub)...)
	stop := RunConsumer(t, k)
	p, err := pub.Publisher(omnibus.BatchSize(37, 1<<20))
	if err != nil {
		t.Fatalf("Publisher: %v", err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	const n, keys = 3000, 50
	max := pub.Capabilities().MaxMessageBytes
	var ids []string
	var msgs []*omnibus.Message
	var results []*omnibus.PublishResult
	var big *omnibus.PublishResult
	for i := range n {
		m := &omnibus.Message{
			Key:     "key" + strconv.Itoa(i%keys),
			Type:    "test.event",
			Headers: map[string]string{headerSeq: strconv.FormatInt(seqs.Add(1), 10)},
			Body:    []byte("x"),
		}
		r, err := p.Publish(ctxT(t), topic, m)
		if err != nil {
			t.Fatalf("Publisher.Publish %d: %v", i, err)
		}
		ids, msgs, results = append(ids, m.ID), append(msgs, m), append(results, r)
		if i == n/2 && max > 0 {
			if big, err = p.Publish(ctxT(t), topic, &omnibus.Message{Key: m.Key, Body: make([]byte, max+1)}); err != nil {
				t.Fatalf("Publisher.Publish (oversized): %v", err)
			}
		}
	}
	if err := p.Flush(ctxT(t)); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	for i, r := range results {
		if err := r.Err(); err != nil {
			t.Fatalf("message %d (%s): %v", i, r.ID(), err)
		}
	}
	if big != nil && !errors.Is(big.Err(), omnibus.ErrTooLarge) {
		t.Errorf("oversized message: got %v, want ErrTooLarge", big.Err())
	}
	// With their results ready the messages are the caller's again:
	// what landed must not change with them.
	for _, m := range msgs {
		m.Body[0] = 'y'
		m.Headers[headerSeq] = "written over"
	}
	col.await(t, ids)
	stop()
	col.check(t, orderOf(pub), false)
	for _, id := range ids {
		if got := col.msgs[id].Body; string(got) != "x" {
			t.Fatalf("message %s: body %q, want \"x\"", id, got)
		}
	}
}
