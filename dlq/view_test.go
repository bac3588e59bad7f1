package dlq

import (
	"strings"
	"testing"
)

// TestFormatBody: each format, the automatic choice, cuts that split a
// rune, and an unknown format.
func TestFormatBody(t *testing.T) {
	for _, c := range []struct {
		body, format string
		max          int
		want         string
		cut, err     bool
	}{
		{`{"a":1,"b":[2]}`, FormatAuto, 0, "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}", false, false},
		{`{"a":1,"b":[2]}`, FormatAuto, 5, `{"a":`, true, false},
		{"héllo", FormatAuto, 2, "h", true, false}, // the cut splits é: drop its half
		{"plain text", FormatAuto, 0, "plain text", false, false},
		{"\x00\x01\xff", FormatAuto, 0, "00000000  00 01 ff                                          |...|\n", false, false},
		{"\xffok", FormatText, 0, "\uFFFDok", false, false},
		{"abc", FormatHex, 0, "00000000  61 62 63                                          |abc|\n", false, false},
		{"not json", FormatJSON, 0, "", false, true},
		{"x", "yaml", 0, "", false, true},
	} {
		got, cut, err := FormatBody([]byte(c.body), c.format, c.max)
		if got != c.want || cut != c.cut || (err != nil) != c.err {
			t.Errorf("FormatBody(%q, %s, %d) = %q, %v, %v; want %q, %v, error %v", c.body, c.format, c.max, got, cut, err, c.want, c.cut, c.err)
		}
	}
}

// TestView: the body cut to the view's size, base64 when it is not
// UTF-8, its whole size said.
func TestView(t *testing.T) {
	dl := &DeadLetter{ID: "x", Body: []byte(strings.Repeat("é", 100))}
	v := dl.View(11)
	if v.Body != strings.Repeat("é", 5) || !v.BodyTruncated || v.BodyBytes != 200 || v.BodyBase64 {
		t.Errorf("view of 200 bytes cut at 11: %+v", v)
	}
	dl.Body = []byte{0xff, 0xfe, 0}
	if v := dl.View(0); v.Body != "//4A" || !v.BodyBase64 || v.BodyTruncated {
		t.Errorf("view of a binary body: %+v", v)
	}
}
