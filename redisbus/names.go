package redisbus

// Names: the Redis keys redisbus keeps for a topic and its groups. Every
// key starts with the topic's name, so a topic's keys are found with
// SCAN MATCH "<topic>*".

import "strconv"

// unorderedLane is the lane of an unpartitioned topic.
const unorderedLane = "0"

// streamKey is the stream of partition part of topic (part < 0: the
// topic's one stream, whose key is the topic itself).
func streamKey(topic string, part int) string {
	if part < 0 {
		return topic
	}
	return topic + ":" + strconv.Itoa(part)
}

// layoutKey holds the partition count of a partitioned topic.
func layoutKey(topic string) string { return topic + ":partitions" }

// membersKey is a sorted set of group's live members (score: when the
// member's heartbeat runs out, in the server's milliseconds).
func membersKey(topic, group string) string { return topic + ":members:" + group }

// leaseKey holds the lease of group on one partition's stream: the
// owner's member ID and fencing token.
func leaseKey(stream, group string) string { return stream + ":lease:" + group }

// runsKey is a hash of the run counts of group's redelivered entries of
// one stream: field "<entry ID>", value "<holders>:<delivery count>"
// (see CountRun).
func runsKey(stream, group string) string { return stream + ":runs:" + group }

// fenceKey counts the fencing tokens handed out for group's leases.
func fenceKey(topic, group string) string { return topic + ":fence:" + group }

// positionsKey is a hash of where each group of topic resumes, per
// stream (field "<group>" for an unpartitioned topic, "<group>:<part>"
// for a partition).
func positionsKey(topic string) string { return topic + ":positions" }

// positionField is the field of positionsKey for group's lane.
func positionField(group, lane string, partitioned bool) string {
	if !partitioned {
		return group
	}
	return group + ":" + lane
}

// streamsOf are the streams of a topic of parts partitions (0:
// unpartitioned, one stream).
func streamsOf(topic string, parts int) []string {
	if parts == 0 {
		return []string{topic}
	}
	st := make([]string, parts)
	for p := range st {
		st[p] = streamKey(topic, p)
	}
	return st
}
