package omnibus

import (
	"errors"
	"fmt"
	"slices"

	"github.com/omnibus-go/omnibus/driver"
)

// Sentinel errors. Errors returned by omnibus wrap one of these where the
// condition applies, so callers branch with errors.Is. The transport
// client's own error stays reachable with errors.As.
var (
	// ErrClosed: the client or consumer has been closed.
	ErrClosed = driver.ErrClosed
	// ErrNotFound: the topic, group or resource does not exist.
	ErrNotFound = driver.ErrNotFound
	// ErrUnsupported: the transport lacks a capability the call needs.
	ErrUnsupported = driver.ErrUnsupported
	// ErrTooLarge: a message exceeds the transport's size limit.
	ErrTooLarge = driver.ErrTooLarge
	// ErrInvalid: a malformed URL, an unknown parameter, a bad option.
	ErrInvalid = driver.ErrInvalid
	// ErrRetryable: the server cannot have acted on the request, so trying
	// it again is safe.
	ErrRetryable = driver.ErrRetryable
	// ErrOutcomeUnknown: the server may or may not have acted on the
	// request (the connection was lost before it answered, a request
	// timed out). Publish tries such messages again with the same IDs
	// until its context ends; the transport's documentation says whether
	// one can then be stored twice.
	ErrOutcomeUnknown = driver.ErrOutcomeUnknown
	// ErrUnknownScheme: no driver is registered for the URL's scheme.
	ErrUnknownScheme = errors.New("unknown scheme")
	// ErrPermanent marks a handler error that retrying cannot fix; the
	// message is dead-lettered at once. Wrap errors with [Permanent].
	ErrPermanent = errors.New("permanent failure")
)

// Permanent marks err as permanent: the engine dead-letters the message
// without retrying. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() []error {
	return []error{e.err, ErrPermanent}
}

// IsPermanent reports whether err was marked with [Permanent].
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// CapabilityError is returned when a subscription or call asks for a
// guarantee the transport cannot keep. It wraps [ErrUnsupported].
type CapabilityError struct {
	Scheme     string // the transport's URL scheme
	Capability string // "ordering", "replay", "lag", ...
	Detail     string
}

func (e *CapabilityError) Error() string {
	return fmt.Sprintf("omnibus: %s transport lacks capability %q: %s", e.Scheme, e.Capability, e.Detail)
}

func (e *CapabilityError) Unwrap() error { return ErrUnsupported }

// PublishError reports the messages of a Publish call that did not land.
// Messages not listed did land. errors.Is matches any message's error.
type PublishError struct {
	Topic  string
	Failed []PublishFailure
}

// PublishFailure is one message that failed to publish.
type PublishFailure struct {
	Index int    // position in the Publish call's arguments
	ID    string // the message's ID
	Err   error
}

func (e *PublishError) Error() string {
	first := e.Failed[0]
	return fmt.Sprintf("omnibus: publish %q: %d message(s) failed, first %q: %v", e.Topic, len(e.Failed), first.ID, first.Err)
}

// Unwrap returns every failed message's error.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

func slicesSortFailures(f []PublishFailure) {
	slices.SortFunc(f, func(a, b PublishFailure) int { return a.Index - b.Index })
}

// UnsettledError reports messages left unsettled when a drain ran out of
// time. They are not lost: the transport delivers them again.
type UnsettledError struct {
	Topic string
	Count int
	Err   error
}

func (e *UnsettledError) Error() string {
	return fmt.Sprintf("omnibus: drain %q: %d message(s) left unsettled (the transport redelivers them): %v", e.Topic, e.Count, e.Err)
}

func (e *UnsettledError) Unwrap() error { return e.Err }
