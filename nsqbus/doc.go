// Package nsqbus is omnibus's NSQ transport, scheme nsq://, built on
// github.com/nsqio/go-nsq and tested against nsqd and nsqlookupd 1.3.
package nsqbus
