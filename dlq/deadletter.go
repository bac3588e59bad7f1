package dlq

// Dead letters as values: the engine's headers parsed into a DeadLetter,
// the headers a replay adds, and the Filter that selects dead letters.
// Pure functions: no goroutine or lock of their own.

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Headers a replay adds to the message it publishes again.
const (
	// HeaderReplayedFrom names the dead-letter topic the message was
	// replayed from.
	HeaderReplayedFrom = "omnibus-replayed-from"
	// HeaderReplayedAt is when it was replayed (RFC 3339, UTC).
	HeaderReplayedAt = "omnibus-replayed-at"
	// HeaderReplays counts the replays of the message, this one included.
	HeaderReplays = "omnibus-replays"
	// HeaderReplayedID is the ID the message had when it was first
	// dead-lettered. A replay publishes it under a new ID (see Replay).
	HeaderReplayedID = "omnibus-replayed-id"
)

// HeaderMovedID is the ID of a dead letter the tools appended to an
// ordered dead-letter topic again (see the package documentation): the
// copy travels under an ID of its own, since a transport that drops a
// message whose ID it saw lately (JetStream) would drop it, and is read
// back with this ID.
const HeaderMovedID = "omnibus-moved-id"

// deadHeaders are the headers the engine adds when it dead-letters a
// message; a replay leaves them out, so the message goes back as it was
// published, with the replay headers added.
var deadHeaders = []string{
	omnibus.HeaderDeadReason, omnibus.HeaderDeadAttempts, omnibus.HeaderDeadTopic,
	omnibus.HeaderDeadGroup, omnibus.HeaderDeadLane, omnibus.HeaderDeadPosition,
	omnibus.HeaderDeadFirstFailure, omnibus.HeaderDeadLastFailure,
}

// DeadLetter is one message of a dead-letter topic and what the engine's
// headers say about its failure. A message without those headers (one
// published to the topic by hand) is a DeadLetter with empty failure
// fields.
type DeadLetter struct {
	// The message as it was dead-lettered.
	ID          string
	Key         string
	Type        string
	Source      string
	Time        time.Time
	ContentType string
	// Headers are all of the message's headers, the engine's
	// dead-letter headers included.
	Headers map[string]string
	Body    []byte

	// Lane and Position are where the dead letter is in the dead-letter
	// topic.
	Lane     string
	Position string

	// Reason is the error the handler returned last
	// (omnibus-dead-reason).
	Reason string
	// Attempts is how many times the message was handled
	// (omnibus-dead-attempts); 0 when not said.
	Attempts int
	// OriginTopic and OriginGroup are the topic the message was read from
	// and the group that failed it (omnibus-dead-topic,
	// omnibus-dead-group); a replay without a target goes to OriginTopic.
	OriginTopic string
	OriginGroup string
	// OriginLane and OriginPosition are where it was in OriginTopic
	// (omnibus-dead-lane, omnibus-dead-position).
	OriginLane     string
	OriginPosition string
	// FirstFailure and LastFailure are when the first and the last
	// attempts failed (omnibus-dead-first-failure,
	// omnibus-dead-last-failure); zero when not said.
	FirstFailure time.Time
	LastFailure  time.Time
	// Replays counts the times the message was replayed before it came
	// back here (omnibus-replays).
	Replays int
	// OriginalID is the ID the message had when it was first
	// dead-lettered: ID, or omnibus-replayed-id for a replayed message.
	OriginalID string
}

// parse makes a DeadLetter of a delivery read from the dead-letter topic.
// Headers that do not parse leave their field zero.
func parse(d *driver.Delivery) *DeadLetter {
	h := d.Headers
	dl := &DeadLetter{
		ID: d.ID, Key: d.Key, Type: d.Type, Source: d.Source, Time: d.Time, ContentType: d.ContentType,
		Headers: h, Body: d.Body, Lane: d.Lane, Position: d.Position,
		Reason:      h[omnibus.HeaderDeadReason],
		OriginTopic: h[omnibus.HeaderDeadTopic], OriginGroup: h[omnibus.HeaderDeadGroup],
		OriginLane: h[omnibus.HeaderDeadLane], OriginPosition: h[omnibus.HeaderDeadPosition],
	}
	if dl.Headers == nil {
		dl.Headers = map[string]string{}
	}
	if id := h[HeaderMovedID]; id != "" {
		dl.ID = id
	}
	dl.Attempts, _ = strconv.Atoi(h[omnibus.HeaderDeadAttempts])
	dl.Replays, _ = strconv.Atoi(h[HeaderReplays])
	if dl.OriginalID = h[HeaderReplayedID]; dl.OriginalID == "" {
		dl.OriginalID = dl.ID
	}
	dl.FirstFailure, _ = time.Parse(time.RFC3339Nano, h[omnibus.HeaderDeadFirstFailure])
	dl.LastFailure, _ = time.Parse(time.RFC3339Nano, h[omnibus.HeaderDeadLastFailure])
	return dl
}

// replayMessage is dl as a replay publishes it: the message without the
// dead-letter headers, with the replay recorded, the same key, type,
// source, time and body, and the ID of its replay (ReplayID).
func (dl *DeadLetter) replayMessage(from string, at time.Time) *omnibus.Message {
	h := maps.Clone(dl.Headers)
	if h == nil {
		h = map[string]string{}
	}
	for _, k := range deadHeaders {
		delete(h, k)
	}
	delete(h, HeaderMovedID)
	h[HeaderReplayedFrom] = from
	h[HeaderReplayedAt] = at.UTC().Format(time.RFC3339Nano)
	h[HeaderReplays] = strconv.Itoa(dl.Replays + 1)
	h[HeaderReplayedID] = dl.OriginalID
	return &omnibus.Message{ID: dl.ReplayID(), Key: dl.Key, Type: dl.Type, Source: dl.Source, Time: dl.Time,
		ContentType: dl.ContentType, Headers: h, Body: dl.Body}
}

// ReplayID is the ID a replay publishes dl under: its original ID
// followed by "-r" and the replay's number ("-r1" for the first). A new
// ID, because a transport that drops a message whose ID it saw lately
// (JetStream within its duplicate window) would drop the replay; the same
// for every replay of one dead letter, so a replay published twice (a
// crash between publish and settle) is one ID to such a transport and to
// an idempotent consumer.
func (dl *DeadLetter) ReplayID() string {
	return dl.OriginalID + "-r" + strconv.Itoa(dl.Replays+1)
}

// Filter selects dead letters. Every field set must match; the zero
// Filter matches every dead letter.
type Filter struct {
	// IDs: the message ID is one of these.
	IDs []string
	// Reason: the reason contains this text.
	Reason string
	// Topic and Group: the origin topic and group are these.
	Topic string
	Group string
	// Key: the message key is this.
	Key string
	// Since and Until bound the last failure: at or after Since, before
	// Until.
	Since time.Time
	Until time.Time
}

// IsZero reports whether f selects every dead letter.
func (f Filter) IsZero() bool {
	return len(f.IDs) == 0 && f.Reason == "" && f.Topic == "" && f.Group == "" && f.Key == "" &&
		f.Since.IsZero() && f.Until.IsZero()
}

// Match reports whether dl is selected by f.
func (f Filter) Match(dl *DeadLetter) bool {
	switch {
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, dl.ID),
		f.Reason != "" && !strings.Contains(dl.Reason, f.Reason),
		f.Topic != "" && dl.OriginTopic != f.Topic,
		f.Group != "" && dl.OriginGroup != f.Group,
		f.Key != "" && dl.Key != f.Key,
		!f.Since.IsZero() && dl.LastFailure.Before(f.Since),
		!f.Until.IsZero() && !dl.LastFailure.Before(f.Until):
		return false
	}
	return true
}
