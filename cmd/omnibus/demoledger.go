package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/omnibus-go/omnibus"
)

// order is the demo's message body.
type order struct {
	ID       string  `json:"order"`
	Customer string  `json:"customer"`
	Seq      int     `json:"seq"` // the customer's order number, from 1
	Amount   float64 `json:"amount"`
	Cursed   bool    `json:"cursed,omitempty"` // always fails: a poison order
}

// Poison kinds.
const (
	poisonUndecodable = "undecodable" // bad JSON: a permanent failure
	poisonFailing     = "failing"     // always fails: retried, then dead-lettered
)

// ledger records what the demo published, processed and dead-lettered,
// and checks it at the end. It is safe for concurrent use.
type ledger struct {
	mu sync.Mutex

	valid      map[string]string // order ID -> customer, for every valid order published
	poison     map[string]string // message ID -> poison kind
	customers  map[string]int    // customer -> orders published (the last seq)
	processed  map[string]int    // order ID -> times processed
	lastSeq    map[string]int    // customer -> seq of the last order processed for the first time
	outOfOrder []string          // examples of order violations
	violations int
	dead       map[string]int    // message ID -> times seen in the dead-letter topic
	deadInfo   map[string]string // message ID -> attempts and reason
}

func newLedger() *ledger {
	return &ledger{
		valid: map[string]string{}, poison: map[string]string{}, customers: map[string]int{},
		processed: map[string]int{}, lastSeq: map[string]int{}, dead: map[string]int{}, deadInfo: map[string]string{},
	}
}

// expect notes a valid order about to be published and returns its seq.
func (l *ledger) expect(id, customer string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.valid[id] = customer
	l.customers[customer]++
	return l.customers[customer]
}

func (l *ledger) expectPoison(id, kind string) {
	l.mu.Lock()
	l.poison[id] = kind
	l.mu.Unlock()
}

// process records that the order was handled. The first handling of each
// of a customer's orders must come in the customer's order: 1, 2, 3...
// Later handlings of the same order are redeliveries (at least once).
func (l *ledger) process(o order) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.processed[o.ID]++
	if l.processed[o.ID] > 1 {
		return
	}
	last := l.lastSeq[o.Customer]
	if o.Seq != last+1 {
		l.violations++
		if len(l.outOfOrder) < 3 {
			l.outOfOrder = append(l.outOfOrder, fmt.Sprintf("%s: order %d after %d", o.Customer, o.Seq, last))
		}
	}
	l.lastSeq[o.Customer] = max(last, o.Seq)
}

// deadLettered records a message read from the dead-letter topic.
func (l *ledger) deadLettered(m *omnibus.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead[m.ID]++
	l.deadInfo[m.ID] = fmt.Sprintf("after %s attempt(s): %s", m.Headers[omnibus.HeaderDeadAttempts], m.Headers[omnibus.HeaderDeadReason])
}

// counts returns the orders processed at least once and the messages
// dead-lettered at least once.
func (l *ledger) counts() (processed, dead int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.processed), len(l.dead)
}

// complete reports whether every valid order was processed and every
// poison order dead-lettered.
func (l *ledger) complete() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.processed) < len(l.valid) {
		return false
	}
	for id := range l.poison {
		if l.dead[id] == 0 {
			return false
		}
	}
	return true
}

// check is one line of the verified summary.
type check struct {
	ok     bool
	skip   bool
	name   string
	detail string
}

// verify checks the ledger. lag is the total lag left, -1 when unknown.
func (l *ledger) verify(ordered bool, maxAttempts int, lag int64) []check {
	l.mu.Lock()
	defer l.mu.Unlock()
	var checks []check

	// Every order processed.
	var missing []string
	dups := 0
	for id := range l.valid {
		switch n := l.processed[id]; {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			dups += n - 1
		}
	}
	slices.Sort(missing)
	c := check{ok: len(missing) == 0, name: "every order processed",
		detail: fmt.Sprintf("%d of %d", len(l.valid)-len(missing), len(l.valid))}
	if dups > 0 {
		c.detail += fmt.Sprintf(", %d redelivered (allowed: at least once)", dups)
	}
	if len(missing) > 0 {
		c.detail += ", missing " + examples(missing)
	}
	checks = append(checks, c)

	// Per-customer order.
	if ordered {
		c = check{ok: l.violations == 0, name: "per-customer order held",
			detail: fmt.Sprintf("%d customers, every customer's orders handled 1, 2, 3...", len(l.customers))}
		if l.violations > 0 {
			c.detail = fmt.Sprintf("%d out of order, e.g. %s", l.violations, strings.Join(l.outOfOrder, "; "))
		}
	} else {
		c = check{ok: true, skip: true, name: "per-customer order",
			detail: "not promised: the transport's lanes are unordered"}
	}
	checks = append(checks, c)

	// Poison orders dead-lettered exactly once, and nothing else.
	var bad []string
	kinds := map[string]int{}
	for id, kind := range l.poison {
		kinds[kind]++
		switch n := l.dead[id]; {
		case n == 0:
			bad = append(bad, id+" not dead-lettered")
		case n > 1:
			bad = append(bad, fmt.Sprintf("%s dead-lettered %d times", id, n))
		case kind == poisonFailing && !strings.HasPrefix(l.deadInfo[id], "after "+strconv.Itoa(maxAttempts)+" "):
			bad = append(bad, fmt.Sprintf("%s dead-lettered %s, want after %d attempts", id, l.deadInfo[id], maxAttempts))
		}
	}
	for id := range l.dead {
		if _, ok := l.poison[id]; !ok {
			bad = append(bad, id+" is a valid order but was dead-lettered")
		}
	}
	slices.Sort(bad)
	c = check{ok: len(bad) == 0, name: "poison orders dead-lettered exactly once",
		detail: fmt.Sprintf("%d of %d (%d undecodable: at once; %d failing: after %d attempts)",
			len(l.poison)-countPrefix(bad, " not dead-lettered"), len(l.poison), kinds[poisonUndecodable], kinds[poisonFailing], maxAttempts)}
	if len(bad) > 0 {
		c.detail = examples(bad)
	}
	checks = append(checks, c)

	// Nothing lost.
	processedValid := len(l.valid) - len(missing)
	deadPoison := 0
	for id := range l.poison {
		if l.dead[id] > 0 {
			deadPoison++
		}
	}
	total := len(l.valid) + len(l.poison)
	c = check{ok: processedValid+deadPoison == total && lag <= 0, name: "nothing lost",
		detail: fmt.Sprintf("published %d = processed %d + dead-lettered %d", total, processedValid, deadPoison)}
	switch {
	case lag < 0:
		c.detail += "; lag not reported by this transport"
	default:
		c.detail += fmt.Sprintf("; lag left %d", lag)
	}
	checks = append(checks, c)
	return checks
}

func countPrefix(ss []string, suffix string) int {
	n := 0
	for _, s := range ss {
		if strings.HasSuffix(s, suffix) {
			n++
		}
	}
	return n
}

// examples shows up to three of ss.
func examples(ss []string) string {
	if len(ss) > 3 {
		return strings.Join(ss[:3], ", ") + fmt.Sprintf(" and %d more", len(ss)-3)
	}
	return strings.Join(ss, ", ")
}
