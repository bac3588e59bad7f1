package bus

import (
	"errors"
	"fmt"

	"github.com/omnibus-go/omnibus"
)

var errInvalid = omnibus.ErrInvalid

// Sentinel errors; errors.Is finds them in what the bus returns.
var (
	// ErrDuplicateHandler: a message type already has a handler of that
	// kind in the service (for events: from that publisher). It wraps
	// omnibus.ErrInvalid.
	ErrDuplicateHandler = fmt.Errorf("handler already registered: %w", omnibus.ErrInvalid)
	// ErrNoDeadline: Request was called with a context without a
	// deadline. It wraps omnibus.ErrInvalid.
	ErrNoDeadline = fmt.Errorf("request needs a context with a deadline: %w", omnibus.ErrInvalid)
	// ErrNoReplyPath: Reply was called for a message that names no one
	// to reply to (it was not sent by a bus, or was an event).
	ErrNoReplyPath = errors.New("message has no reply path")
	// ErrNoHandler: a message reached a service without a handler for its
	// type. The handler's error is permanent: the message is
	// dead-lettered with this reason.
	ErrNoHandler = errors.New("no handler for message type")
	// ErrDecode: a message's body could not be decoded (no codec for its
	// content type, or the codec failed). The message is dead-lettered
	// with this reason.
	ErrDecode = errors.New("cannot decode message")
	// ErrStarted: a handler was registered after Start.
	ErrStarted = errors.New("bus already started")
)

// FaultError is what Request returns when the request was
// dead-lettered in the handling service (its handler returned an
// omnibus.Permanent error or ran out of attempts, or the request could
// not be decoded or had no handler there), and the service told the
// requester why.
type FaultError struct {
	Service string // the service that handled the request
	Type    string // the request's message type
	Reason  string // the handler's error
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("bus: request %s failed in service %q: %s", e.Type, e.Service, e.Reason)
}
