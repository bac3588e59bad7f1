package driver_test

import (
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

var timeSeeds = []string{
	"2026-12-06T10:52:01.123456789Z", "2026-12-06T10:52:01Z", "2026-12-06T10:52:01.5Z",
	"2026-02-28T23:59:59.000000001Z", "2024-02-29T00:00:00Z", "2026-02-29T00:00:00Z",
	"2026-12-06T10:52:01.Z", "2026-12-06T10:52:01.1234567890Z", "2026-12-06T24:00:00Z",
	"2026-12-06T10:60:00Z", "2026-12-06T10:00:60Z", "2026-13-06T10:00:00Z", "2026-00-06T10:00:00Z",
	"2026-12-00T10:00:00Z", "2026-12-06t10:52:01z", "2026-12-06T10:52:01+02:00",
	"2026-12-06T10:52:01.5+02:00", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z",
	"2026-12-06T10:52:01,5Z", "+026-12-06T10:52:01Z", "2026-1a-06T10:52:01Z", "",
}

// FuzzParseTime: ParseTime agrees with time.Parse(time.RFC3339Nano) on
// any string: the same error-ness, the same instant and location.
func FuzzParseTime(f *testing.F) {
	for _, s := range timeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, gerr := driver.ParseTime(s)
		want, werr := time.Parse(time.RFC3339Nano, s)
		if (gerr == nil) != (werr == nil) || !got.Equal(want) || got.String() != want.String() {
			t.Fatalf("ParseTime(%q) = %v, %v; time.Parse: %v, %v", s, got, gerr, want, werr)
		}
	})
}

// FuzzParseWritten: for any instant in any zone, ParseTime reads what
// FormatTime writes as time.Parse does, back to the same instant.
func FuzzParseWritten(f *testing.F) {
	for _, s := range timeSeeds {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			f.Add(t.Unix(), int64(t.Nanosecond()), 0)
		}
	}
	f.Add(int64(-62135596800-1), int64(0), 0)  // before year 1
	f.Add(int64(253402300800), int64(7), 3600) // year 10000
	f.Fuzz(func(t *testing.T, sec, nsec int64, offset int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("z", offset%86400))
		written := driver.FormatTime(at)
		back, err := driver.ParseTime(written)
		want, werr := time.Parse(time.RFC3339Nano, written)
		if (err == nil) != (werr == nil) || back != want {
			t.Fatalf("ParseTime(%q) = %v, %v; time.Parse: %v, %v", written, back, err, want, werr)
		}
		if err == nil && !back.Equal(at) {
			t.Fatalf("ParseTime(FormatTime(%v)) = %v", at, back)
		}
	})
}

// BenchmarkTime compares ParseTime with time.Parse.
func BenchmarkTime(b *testing.B) {
	at := time.Date(2026, 12, 6, 10, 52, 1, 123456789, time.UTC)
	s := at.Format(time.RFC3339Nano)
	b.Run("parse/omnibus", func(b *testing.B) {
		for b.Loop() {
			if _, err := driver.ParseTime(s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse/time", func(b *testing.B) {
		for b.Loop() {
			if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
