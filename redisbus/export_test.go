package redisbus

// RunsKey is the hash of group's run counts on stream.
func RunsKey(stream, group string) string { return runsKey(stream, group) }
