package sqlbus_test

// child reports whether this test binary runs as a child process of a
// test, and runs it.
func child() bool { return false }
