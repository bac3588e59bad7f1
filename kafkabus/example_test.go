package kafkabus_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/kafkabus"
)

// Open a Kafka cluster by URL and publish a message. The cluster here is
// an in-process fake; in production the URL names your brokers, for
// example kafka://user:password@broker1:9092,broker2:9092?mechanism=SCRAM-SHA-512&compression=zstd.
func Example_kafka() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",") + "?client_id=billing&durability=all"
	c, err := omnibus.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Publish(ctx, "orders", &omnibus.Message{
		Key:  "customer-42", // one customer's orders stay in order on one partition
		Type: "order.created",
		Body: []byte(`{"order":1001}`),
	})
	fmt.Println("published:", err == nil)
	fmt.Println("lanes are partitions:", c.Capabilities().ExclusiveLanes)
	// Output:
	// published: true
	// lanes are partitions: true
}
