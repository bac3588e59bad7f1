package kafkabus

import "testing"

// TestParseBegun reads the commit metadata of attempts across holders,
// as written now (with the member that wrote it last) and before
// (without): a record of another offset, or none of omnibus's, says
// nothing.
func TestParseBegun(t *testing.T) {
	for _, tt := range []struct {
		meta         string
		offset       int64
		holders      int
		member, name string
	}{
		{begunMeta(42, 2, "ab12"), 42, 2, "ab12", "now"},
		{"omnibus-begun 42 3", 42, 3, "", "before the member was named"},
		{begunMeta(41, 2, "ab12"), 42, 0, "", "another offset"},
		{"omnibus-begun 42 x ab12", 42, 0, "", "not a count"},
		{"omnibus-begun 42 2 ab12 extra", 42, 0, "", "too many fields"},
		{"somebody else's", 42, 0, "", "not omnibus's"},
	} {
		n, member := parseBegun(tt.meta, tt.offset)
		if n != tt.holders || member != tt.member {
			t.Errorf("%s: parseBegun(%q, %d) = %d, %q; want %d, %q", tt.name, tt.meta, tt.offset, n, member, tt.holders, tt.member)
		}
	}
}
