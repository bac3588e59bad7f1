package redisbus_test

// childEnv names the URL, topic and group a child member of the crash
// test reads (see runChild).
const childEnv = "REDISBUS_CRASH_CHILD"

func runChild() int { return 0 }
