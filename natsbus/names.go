package natsbus

// Names: which topics NATS can take, and the server-side names derived
// from topics and groups (streams, subjects, consumers, KV buckets and
// their keys), and the partition of a key. Pure functions: no goroutine
// or lock of their own.

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/omnibus-go/omnibus/driver"
)

// checkTopic reports whether topic can be a NATS subject: no whitespace
// or control characters, no wildcards ('*', '>'), no empty tokens and no
// leading '$' (reserved for the server's own subjects).
func checkTopic(op, topic string) error {
	bad := func(why string) error {
		return fmt.Errorf("natsbus: %s %q: topic is not a valid NATS subject: %s: %w", op, topic, why, driver.ErrInvalid)
	}
	if topic == "" {
		return bad("empty")
	}
	if !utf8.ValidString(topic) {
		return bad("not valid UTF-8")
	}
	for i, r := range topic {
		switch {
		case r == '*' || r == '>':
			return bad(fmt.Sprintf("illegal character %q (a wildcard) at byte %d", r, i))
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return bad(fmt.Sprintf("illegal character %q at byte %d", r, i))
		case r == '$' && i == 0:
			return bad(fmt.Sprintf("illegal character %q at byte 0 (subjects starting with $ are reserved for the server)", r))
		}
	}
	if strings.HasPrefix(topic, ".") || strings.HasSuffix(topic, ".") || strings.Contains(topic, "..") {
		return bad("empty token (a leading, trailing or doubled '.')")
	}
	return nil
}

// safeName turns s into a JetStream stream, consumer or bucket name:
// letters, digits, '-' and '_' are kept; when anything else had to be
// replaced, a hash of s is appended so distinct inputs stay distinct.
func safeName(s string) string {
	var b strings.Builder
	replaced := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
			replaced = true
		}
	}
	name := b.String()
	if len(name) > 200 {
		name, replaced = name[:200], true
	}
	if replaced {
		h := fnv.New32a()
		_, _ = h.Write([]byte(s))
		name += "_" + strconv.FormatUint(uint64(h.Sum32()), 16)
	}
	return name
}

// streamName is the stream that holds topic.
func streamName(topic string) string { return safeName(topic) }

// partitionSubject is the subject of partition p of topic.
func partitionSubject(topic string, p int) string { return topic + "." + strconv.Itoa(p) }

// Names of the partitioned mode's server-side objects.
//
//   - partitionConsumer: the durable consumer of one partition for a group;
//   - leaseBucket: the KV bucket of a group's leases, one per stream and
//     group, holding "p.<partition>" = owner's member ID and
//     "m.<member ID>" = a member's heartbeat;
//   - positionBucket: the KV bucket of a group's positions (see
//     positions), partitioned or not.
func partitionConsumer(group string, p int) string { return safeName(group) + "_p" + strconv.Itoa(p) }
func leaseBucket(stream, group string) string      { return safeName(stream + ".leases." + group) }
func positionBucket(stream, group string) string   { return safeName(stream + ".positions." + group) }
func leaseKey(p int) string                        { return "p." + strconv.Itoa(p) }
func memberKey(id string) string                   { return "m." + id }

// Partition returns the partition a key lands on in a topic of n
// partitions: FNV-1a of the key modulo n. Empty keys are spread
// round-robin instead.
func Partition(key string, n int) int { return driver.Partition(key, n) }
