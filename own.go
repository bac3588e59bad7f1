package omnibus

import (
	"runtime"
	"sync"
)

// owners records the goroutines that run a consumer's callbacks: its
// workers (handlers and observers), its settle loops (observers) and the
// driver's goroutines while they are inside a Lanes call (observers).
// Close, Shutdown and Scale wait for those goroutines, so called from one
// of them they would wait for themselves: they look here first.
type owners struct {
	mu  sync.Mutex
	ids map[uint64]int
}

// enter records the calling goroutine until the matching leave.
func (o *owners) enter() uint64 {
	id := goid()
	o.mu.Lock()
	if o.ids == nil {
		o.ids = map[uint64]int{}
	}
	o.ids[id]++
	o.mu.Unlock()
	return id
}

func (o *owners) leave(id uint64) {
	o.mu.Lock()
	if o.ids[id]--; o.ids[id] <= 0 {
		delete(o.ids, id)
	}
	o.mu.Unlock()
}

// inside reports whether the calling goroutine is one of the consumer's.
func (o *owners) inside() bool {
	id := goid()
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[id] > 0
}

// goid returns the calling goroutine's ID, read from the first line of its
// stack trace ("goroutine 42 [running]:"): Go offers no other way. It is
// called when a worker or loop starts, on each Lanes call and by Close,
// Shutdown and Scale: never per message.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) {
		return 0
	}
	var id uint64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
