package fuzztest

// Messages built from fuzz input, for the targets that check that a
// transport's CloudEvents mapping round-trips: what a client publishes
// arrives as it was sent.

import (
	"bytes"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Message is the message a round-trip target publishes: its fields from
// the fuzz input, its time nanos after the epoch (none for 0), and its
// headers from hs, lines of name=value. A header Publish refuses (a name
// a CloudEvents binding owns) is left out, as is a content type in the
// JSON event format, which makes the message a structured event that is
// read as one. Publish fills an empty ID; so does Message.
func Message(id, key, typ, source, contentType string, nanos int64, hs string, body []byte) *driver.Message {
	if id == "" {
		id = "id"
	}
	if driver.Structured(contentType) {
		contentType = ""
	}
	m := &driver.Message{ID: id, Key: key, Type: typ, Source: source, ContentType: contentType, Body: body}
	if nanos != 0 {
		m.Time = time.Unix(0, nanos).UTC()
	}
	for line := range strings.SplitSeq(hs, "\n") {
		name, value, ok := strings.Cut(line, "=")
		if !ok || driver.ReservedHeader(name) {
			continue
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[name] = value
	}
	return m
}

// Headers returns hs, lines of name=value, as pairs in order, reserved
// names and all: what a received message may carry.
func Headers(hs string) [][2]string {
	var pairs [][2]string
	for line := range strings.SplitSeq(hs, "\n") {
		name, value, _ := strings.Cut(line, "=")
		pairs = append(pairs, [2]string{name, value})
	}
	return pairs
}

// Same fails t when got differs from want in any field, header or body
// (a nil body and an empty one are the same; times compare as instants).
func Same(t *testing.T, want, got *driver.Message) {
	t.Helper()
	var diffs []string
	for _, f := range []struct{ name, want, got string }{
		{"ID", want.ID, got.ID},
		{"Key", want.Key, got.Key},
		{"Type", want.Type, got.Type},
		{"Source", want.Source, got.Source},
		{"ContentType", want.ContentType, got.ContentType},
	} {
		if f.want != f.got {
			diffs = append(diffs, fmt.Sprintf("%s %q, want %q", f.name, f.got, f.want))
		}
	}
	if !want.Time.Equal(got.Time) {
		diffs = append(diffs, fmt.Sprintf("Time %v, want %v", got.Time, want.Time))
	}
	if !maps.Equal(want.Headers, got.Headers) && (len(want.Headers) > 0 || len(got.Headers) > 0) {
		diffs = append(diffs, fmt.Sprintf("Headers %q, want %q", got.Headers, want.Headers))
	}
	if !bytes.Equal(want.Body, got.Body) {
		diffs = append(diffs, fmt.Sprintf("Body %q, want %q", got.Body, want.Body))
	}
	if len(diffs) > 0 {
		t.Errorf("the message did not round-trip:\n%s", strings.Join(diffs, "\n"))
	}
}

// SeedMessages adds the messages every round-trip target starts from,
// for a target taking (id, key, typ, source, contentType, nanos, hs,
// body).
func SeedMessages(f *testing.F) {
	f.Add("id-1", "customer-7", "order.created", "/shop", "application/json", int64(1764756672123456789),
		"tenant=acme\ntrace-id=abc def\nsubject=order-42", []byte(`{"total":42}`))
	f.Add("", "", "", "", "", int64(0), "", []byte(nil))
	f.Add("x", "k", "t", "s", "text/plain; charset=utf-8", int64(-1), "Tenant=upper\ntenant=lower\nX-Request-Id=1\nid=plain\ndata=d", []byte{0, 1, 2})
	f.Add("x", " k ", "t\r\n", "s", "", int64(1), "a= spaced \nb=\ttab", []byte("body"))
	f.Add("x", "k", "t", "s", "", int64(1), "omnibus-attempt=7\nx-death=1\nnats-msg-id=2\nce_bad=3\nContent-Type=t", []byte("b"))
	f.Add("{", "k", "t", "s", "application/cloudevents+json", int64(1), "=empty\né=utf8\na/b=c", []byte(`{"specversion":"1.0","id":"x"}`))
}
