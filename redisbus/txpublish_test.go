package redisbus_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestPartitionedBatchAllOrNothing: a batch to a partitioned topic is one
// transaction. When the server refuses one of its XADDs as it queues it
// (here an ACL rule; after a restart, LOADING), it stores none of the
// batch: in a plain pipeline it stored the others, and those published
// again after the refused ones would land behind newer messages of their
// key.
func TestPartitionedBatchAllOrNothing(t *testing.T) {
	srv := startPrivateServer(t)
	ctx := context.Background()
	c := transporttest.Open(t, with(srv.url(), "partitions=2"))
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer rdb.Close()
	keyOf := map[int]string{}
	for i := 0; len(keyOf) < 2; i++ {
		k := "k" + string(rune('a'+i))
		if _, ok := keyOf[driver.Partition(k, 2)]; !ok {
			keyOf[driver.Partition(k, 2)] = k
		}
	}
	const topic = "tx"
	if err := c.Publish(ctx, topic, &omnibus.Message{Key: keyOf[0]}, &omnibus.Message{Key: keyOf[1]}); err != nil {
		t.Fatal(err)
	}
	// Writes to partition 0's stream only; reads of every key.
	if err := rdb.Do(ctx, "ACL", "SETUSER", "default", "resetkeys", "~"+topic+":0", "~"+topic+":partitions", "%R~*").Err(); err != nil {
		t.Fatal(err)
	}
	perr := c.Publish(ctx, topic, &omnibus.Message{Key: keyOf[0]}, &omnibus.Message{Key: keyOf[1]})
	if perr == nil {
		t.Fatal("a batch with a refused XADD published")
	}
	if n, err := rdb.XLen(ctx, topic+":0").Result(); err != nil || n != 1 {
		t.Errorf("partition 0 holds %d entries (%v) after the batch refused with %v, want 1: the batch was stored in part", n, err, perr)
	}
}
