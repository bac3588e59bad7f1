package natsbus

import (
	"testing"
	"time"
)

// FuzzPosition: a stored position record of any content decodes without
// panic (a value that is not a record of the stream reads as none), and
// a record decodes to what was encoded, for the stream it was written
// for only.
func FuzzPosition(f *testing.F) {
	f.Add([]byte(`{"next":42,"stream_created":"2026-12-03T04:11:00.123456789Z"}`), uint64(42), int64(1764735060123456789))
	f.Add([]byte(`{"next":0}`), uint64(1), int64(0))
	f.Add([]byte(`not json`), uint64(1<<63), int64(-1))
	f.Add([]byte(`{"next":-1,"stream_created":null}`), uint64(7), int64(1))
	f.Fuzz(func(t *testing.T, stored []byte, next uint64, nanos int64) {
		created := time.Unix(0, nanos).UTC()
		_, _ = decodePosition(stored, created)

		b := encodePosition(next, created)
		got, ok := decodePosition(b, created)
		if want := next > 0; ok != want || ok && got != next {
			t.Errorf("decodePosition(%s) = %d, %v; want %d, %v", b, got, ok, next, want)
		}
		if _, ok := decodePosition(b, created.Add(time.Nanosecond)); ok {
			t.Errorf("decodePosition(%s) took a record of another stream (created a nanosecond apart)", b)
		}
	})
}
