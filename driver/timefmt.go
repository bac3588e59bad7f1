package driver

import "time"

// AppendTime appends t in UTC as RFC 3339 with the nanoseconds that are
// not 0 (time.RFC3339Nano): every message a transport writes carries its
// time so, and every one it reads is parsed back with [ParseTime]. (A
// formatter of its own measured 103 ns against the time package's 112:
// not worth its code.)
func AppendTime(dst []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(dst, time.RFC3339Nano)
}

// daysFrom is the number of days from 1970-01-01 to the date, for years
// from 1970, by Howard Hinnant's days_from_civil: years that start in
// March, so that the leap day ends one, and eras of 400 years.
func daysFrom(year, month, day int) int {
	if month <= 2 {
		year--
	}
	era := year / 400
	yoe := year - era*400
	doy := (153*((month+9)%12)+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// FormatTime is [AppendTime] as a string.
func FormatTime(t time.Time) string {
	var buf [len("2006-01-02T15:04:05.999999999Z")]byte
	return string(AppendTime(buf[:0], t))
}

// ParseTime parses s as time.Parse(time.RFC3339Nano, s) does, with the
// same time and an error for the same strings; the form [AppendTime]
// writes (in UTC, from 1970, up to day 28 of a month) is read without
// time.Parse, in about half its time.
func ParseTime(s string) (time.Time, error) {
	if t, ok := parseUTC(s); ok {
		return t, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// parseUTC reads s in the form 2006-01-02T15:04:05[.fraction]Z from
// the year 1970, with a day of month up to 28 so that every field in
// range is a valid date; false for anything else, which time.Parse then
// judges.
func parseUTC(s string) (time.Time, bool) {
	const short = len("2006-01-02T15:04:05Z")
	if len(s) < short || len(s) > short+len(".999999999") || s[len(s)-1] != 'Z' ||
		s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	for i := range short - 1 {
		if c := s[i]; (c < '0' || c > '9') && i != 4 && i != 7 && i != 10 && i != 13 && i != 16 {
			return time.Time{}, false
		}
	}
	num := func(at int) int { return int(s[at]-'0')*10 + int(s[at+1]-'0') }
	year, month, day, hour, minute, sec := num(0)*100+num(2), num(5), num(8), num(11), num(14), num(17)
	if year < 1970 || month < 1 || month > 12 || day < 1 || day > 28 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	ns := 0
	if frac := s[short-1 : len(s)-1]; frac != "" {
		if frac[0] != '.' || len(frac) < 2 {
			return time.Time{}, false
		}
		for _, c := range []byte(frac[1:]) {
			if c < '0' || c > '9' {
				return time.Time{}, false
			}
			ns = ns*10 + int(c-'0')
		}
		for range 10 - len(frac) {
			ns *= 10
		}
	}
	unix := int64(daysFrom(year, month, day))*86400 + int64(hour*3600+minute*60+sec)
	return time.Unix(unix, int64(ns)).UTC(), true
}
