package nsqbus

// Names: omnibus topics and groups as NSQ topic and channel names.

import (
	"fmt"
	"hash/fnv"

	"github.com/omnibus-go/omnibus/driver"
)

// maxName is the longest topic or channel name nsqd takes.
const maxName = 64

// ephemeralSuffix marks a channel nsqd deletes when its last consumer
// leaves.
const ephemeralSuffix = "#ephemeral"

// nsqName returns the NSQ name of an omnibus topic or group: the name
// itself when it fits in room bytes, else its first bytes and a hash of
// the whole, so that every client maps a name alike. Characters NSQ
// does not allow (anything but ASCII letters, digits, '.', '_' and '-')
// are an error wrapping driver.ErrInvalid.
func nsqName(what, name string, room int) (string, error) {
	if name == "" {
		return "", fmt.Errorf("empty %s name: %w", what, driver.ErrInvalid)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", fmt.Errorf("%s %q: NSQ names take only ASCII letters, digits, '.', '_' and '-': %w", what, name, driver.ErrInvalid)
		}
	}
	if len(name) <= room {
		return name, nil
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return fmt.Sprintf("%s-%08x", name[:room-9], h.Sum32()), nil
}

// topicName is the NSQ topic of an omnibus topic.
func topicName(topic string) (string, error) { return nsqName("topic", topic, maxName) }

// channelName is the NSQ channel of a consumer group: ephemeral for a
// throwaway group.
func channelName(group string, ephemeral bool) (string, error) {
	if !ephemeral {
		return nsqName("group", group, maxName)
	}
	n, err := nsqName("group", group, maxName-len(ephemeralSuffix))
	if err != nil {
		return "", err
	}
	return n + ephemeralSuffix, nil
}
