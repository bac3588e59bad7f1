package kinesisbus

import (
	"context"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// lostLanes records Lanes.Lost.
type lostLanes struct {
	mu   sync.Mutex
	lost []string
}

func (l *lostLanes) Claimed([]string)                  {}
func (l *lostLanes) Revoked(context.Context, []string) {}
func (l *lostLanes) Lost(ids []string) {
	l.mu.Lock()
	l.lost = append(l.lost, ids...)
	l.mu.Unlock()
}

func (l *lostLanes) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lost)
}

// TestFailedRenewalsKeepTheLease: renewals that fail (DynamoDB refuses
// the connection), however many in a row, do not give a lease up: its
// deadline alone does, through the watchdog.
func TestFailedRenewalsKeepTheLease(t *testing.T) {
	kin := testenv.Getenv("OMNIBUS_KINESIS_ADDR", "127.0.0.1:4567")
	testenv.Require(t, "kinesalite", kin, "scripts/test.sh")
	// A port nothing listens on: every DynamoDB call fails at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	u, _ := url.Parse("kinesis://AKIDTEST:secretTEST@us-east-1?endpoint=http://" + kin + "&dynamodb_endpoint=http://" + closed + "&failover_time=400ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := Driver{}.Open(ctx, u, driver.OpenOptions{Logger: testLogger()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	c := dc.(*conn)
	lanes := &lostLanes{}
	s := &sub{
		conn: c, stream: "s", table: &table{c: c, name: "kbi-unreachable"}, me: "member-a",
		lanes: lanes, logger: testLogger(),
		wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), check: make(chan struct{}, 1),
		held: map[string]*shard{}, revoke: map[string]*shard{},
	}
	sh := &shard{id: "shardId-000000000000", counter: 5, claimed: true, space: make(chan struct{}, 1)}
	// As if its last write had begun now, with a failover_time of an
	// hour: only failures can give it up before the test ends.
	deadline := time.Now().Add(time.Hour)
	sh.deadline = deadline
	s.held[sh.id] = sh
	for i := range 3 {
		if !s.renew(ctx, sh) {
			t.Fatalf("failed renewal %d reported the lease taken by another member", i+1)
		}
	}
	s.expire(time.Now())
	if !s.valid(sh, time.Now()) || len(lanes.got()) > 0 || sh.counter != 5 {
		t.Fatalf("after 3 failed renewals: valid %v, lost %v, counter %d; want the lease kept, counter 5", s.valid(sh, time.Now()), lanes.got(), sh.counter)
	}
	s.expire(deadline)
	if got := lanes.got(); !slices.Equal(got, []string{sh.id}) {
		t.Fatalf("at the deadline the watchdog declared %v lost, want [%s]", got, sh.id)
	}
}
