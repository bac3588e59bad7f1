package omnibus

// Calls from inside: Close, Shutdown and Scale wait for the engine's
// goroutines, so called from one of them (a handler, or an observer) they
// would wait for themselves; so would a Publisher's Flush and Close, and
// a Publish waiting for room, called from a PublishHook's end while the
// Publisher settles. They look at their caller's stack first.

import (
	"reflect"
	"runtime"
)

// engineFuncs are the functions at the bottom of the engine's goroutines
// that run user callbacks: workers run handlers and observers, the settle
// loop observers of commits, and the driver's goroutines observers of
// lane events while they are inside a Lanes call.
var engineFuncs = funcNames((*member).worker, (*member).settleLoop, (*member).Claimed, (*member).Revoked, (*member).Lost)

// settleFuncs is where a Publisher calls the PublishHooks' ends, before
// the messages free their room.
var settleFuncs = funcNames((*Publisher).settle)

func funcNames(fs ...any) map[string]bool {
	names := map[string]bool{}
	for _, f := range fs {
		names[runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()] = true
	}
	return names
}

// calledFromEngine reports whether the calling goroutine is running one of
// the engine's callbacks, of any consumer. It walks the caller's stack
// (a few microseconds): it is called by Close, Shutdown and Scale, never
// per message.
func calledFromEngine() bool { return calledFrom(engineFuncs) }

// calledFromSettle reports whether the calling goroutine is running a
// PublishHook's end for a Publisher, any Publisher (see calledFromEngine
// for the cost).
func calledFromSettle() bool { return calledFrom(settleFuncs) }

// calledFrom reports whether one of funcs is on the caller's stack.
func calledFrom(funcs map[string]bool) bool {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if funcs[f.Function] {
			return true
		}
		if !more {
			return false
		}
	}
}
