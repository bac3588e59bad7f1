package transporttest

// A rebalance storm: members of one group join and leave every few
// hundred milliseconds while messages flow, leaving gracefully (their
// run's context ends: they drain) or abruptly (Close). The storm runs on
// the test's goroutine; joins and leaves run on goroutines of their own,
// at most a few at once, which the storm waits for before it checks.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// stormFor is how long the storm lasts; OMNIBUS_STORM (a duration)
// lengthens it for a soak.
func stormFor() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("OMNIBUS_STORM")); err == nil && d > 0 {
		return d
	}
	return 25 * time.Second
}

// stormMember is one member of the storm's group.
type stormMember struct {
	k    *omnibus.Consumer
	stop func()
}

// testRebalanceStorm: members join and leave every 200-500ms for the
// storm's length while 20,000 messages are published over it: every
// message is handled, none for the first time after a newer one of its
// key (where lanes are ordered); duplicates are counted.
func (s *faultSuite) testRebalanceStorm(t *testing.T) {
	pub, retried := s.publisher(t)
	topic := s.topic(t, pub)
	l := newLedger()
	const group = "storm"
	opts := []omnibus.SubscribeOption{omnibus.Group(group), omnibus.MaxInFlight(32), omnibus.DrainTimeout(5 * time.Second)}
	if s.caps.Replay {
		opts = append(opts, omnibus.StartFrom(omnibus.StartEarliest))
	}
	// Members join on goroutines of their own: clients are opened here,
	// on the test's goroutine, and members take turns on them.
	clients := make([]*omnibus.Client, 4)
	for i := range clients {
		clients[i] = s.open(t)
	}
	var mu sync.Mutex // guards members and n
	var members []*stormMember
	n := 0
	join := func() {
		mu.Lock()
		n++
		name, c := fmt.Sprint("m", n), clients[n%len(clients)]
		mu.Unlock()
		k, err := c.Subscribe(ctxT(t), topic, l.handler(name), opts...)
		if err != nil {
			t.Errorf("Subscribe of member %s: %v", name, err)
			return
		}
		t.Cleanup(func() { within(t, cleanupWait, "Consumer.Close", func() { _ = k.Close() }) })
		m := &stormMember{k: k, stop: runStuck(t, k)}
		mu.Lock()
		members = append(members, m)
		mu.Unlock()
	}
	join()
	join()
	d := stormFor()
	st := startStream(t, pub, topic, faultMessages, d/(faultMessages/100))
	var ops sync.WaitGroup
	pending := make(chan struct{}, 3) // joins and leaves under way
	joins, leaves, abrupt := 0, 0, 0
	began := time.Now()
	for time.Since(began) < d {
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		mu.Lock()
		size := len(members)
		var leaving *stormMember
		if size >= 4 || size > 1 && rand.IntN(2) == 0 {
			i := rand.IntN(size)
			leaving = members[i]
			members = append(members[:i], members[i+1:]...)
		}
		mu.Unlock()
		select {
		case pending <- struct{}{}:
		default:
			if leaving != nil { // too much under way: keep it
				mu.Lock()
				members = append(members, leaving)
				mu.Unlock()
			}
			continue
		}
		ops.Add(1)
		if leaving == nil {
			joins++
			go func() {
				defer ops.Done()
				defer func() { <-pending }()
				join()
			}()
			continue
		}
		leaves++
		hard := rand.IntN(2) == 0
		if hard {
			abrupt++
		}
		go func() {
			defer ops.Done()
			defer func() { <-pending }()
			if hard {
				_ = leaving.k.Close() // hands back what it holds
			}
			leaving.stop()
		}()
	}
	ops.Wait()
	ids := st.wait(t)
	l.await(t, 3*time.Minute, ids)
	mu.Lock()
	left := members
	mu.Unlock()
	for _, m := range left {
		m.stop()
	}
	l.check(t, "rebalance storm", s.caps.Ordered, len(ids),
		fmt.Sprintf("; %v storm: %d joins, %d leaves (%d by Close, the others drained); %d messages published again", d, joins, leaves, abrupt, retried.Load()))
}
