package dlq

// Views: a dead letter as the command and the console show it (JSON
// field names, the body as text, pretty JSON or hex, cut to a size).
// Pure functions.

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// View is a dead letter as JSON shows it, its body cut to a size.
type View struct {
	ID          string            `json:"id"`
	Key         string            `json:"key"`
	Type        string            `json:"type"`
	Source      string            `json:"source"`
	Time        time.Time         `json:"time"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers"`
	// Body is the body as text, or base64 (BodyBase64) when it is not
	// UTF-8, cut to the view's size (BodyTruncated); BodyBytes is the
	// whole body's size.
	Body          string `json:"body"`
	BodyBase64    bool   `json:"body_base64,omitempty"`
	BodyBytes     int    `json:"body_bytes"`
	BodyTruncated bool   `json:"body_truncated,omitempty"`

	Lane     string `json:"lane"`
	Position string `json:"position"`

	Reason         string     `json:"reason"`
	Attempts       int        `json:"attempts"`
	OriginTopic    string     `json:"topic"`
	OriginGroup    string     `json:"group"`
	OriginLane     string     `json:"origin_lane"`
	OriginPosition string     `json:"origin_position"`
	FirstFailure   *time.Time `json:"first_failure,omitempty"`
	LastFailure    *time.Time `json:"last_failure,omitempty"`
	Replays        int        `json:"replays,omitempty"`
}

// View returns dl with at most maxBody bytes of its body (0: all of it).
func (dl *DeadLetter) View(maxBody int) View {
	v := View{ID: dl.ID, Key: dl.Key, Type: dl.Type, Source: dl.Source, Time: dl.Time, ContentType: dl.ContentType,
		Headers: dl.Headers, BodyBytes: len(dl.Body), Lane: dl.Lane, Position: dl.Position,
		Reason: dl.Reason, Attempts: dl.Attempts, OriginTopic: dl.OriginTopic, OriginGroup: dl.OriginGroup,
		OriginLane: dl.OriginLane, OriginPosition: dl.OriginPosition, Replays: dl.Replays}
	if !dl.FirstFailure.IsZero() {
		v.FirstFailure = &dl.FirstFailure
	}
	if !dl.LastFailure.IsZero() {
		v.LastFailure = &dl.LastFailure
	}
	body, cut := clip(dl.Body, maxBody)
	v.BodyTruncated = cut
	if utf8.Valid(body) {
		v.Body = string(body)
	} else {
		v.Body, v.BodyBase64 = base64.StdEncoding.EncodeToString(body), true
	}
	return v
}

// Body formats FormatBody knows.
const (
	FormatAuto = "auto" // JSON when the body is JSON, text when UTF-8, else hex
	FormatText = "text" // the bytes as UTF-8, invalid sequences as U+FFFD
	FormatJSON = "json" // indented; a body that is not JSON is an error
	FormatHex  = "hex"  // offset, 16 bytes in hex, and their printable ASCII
)

// FormatBody renders at most maxBody bytes of body (0: all of it) in
// format, and says whether it cut the body. JSON cut short cannot be
// indented: it is shown as text.
func FormatBody(body []byte, format string, maxBody int) (out string, truncated bool, err error) {
	b, cut := clip(body, maxBody)
	if format == FormatAuto {
		switch {
		case !cut && json.Valid(b):
			format = FormatJSON
		case utf8.Valid(b):
			format = FormatText
		default:
			format = FormatHex
		}
	}
	switch format {
	case FormatText:
		return strings.ToValidUTF8(string(b), "\uFFFD"), cut, nil
	case FormatHex:
		return hex.Dump(b), cut, nil
	case FormatJSON:
		if cut {
			return strings.ToValidUTF8(string(b), "\uFFFD"), cut, nil
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", "  "); err != nil {
			return "", false, err
		}
		return buf.String(), false, nil
	}
	return "", false, errFormat(format)
}

type errFormat string

func (e errFormat) Error() string {
	return "unknown body format " + strings.TrimSpace(string(e)) + " (want auto, text, json or hex)"
}

// clip cuts b to n bytes (0: no cut), and a UTF-8 sequence the cut split
// in two to its start.
func clip(b []byte, n int) ([]byte, bool) {
	if n <= 0 || len(b) <= n {
		return b, false
	}
	b = b[:n]
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.Valid(b[:len(b)-i]) {
			return b[:len(b)-i], true
		}
	}
	return b, true
}
