package kafkabus_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/kafkabus"
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

// Configure the transport in Go where a URL cannot: here a SASL
// mechanism given as a franz-go option (an OAUTHBEARER or AWS_MSK_IAM
// mechanism goes in the same way), and a TLS configuration with
// WithTLS. The URL still names the brokers and sets the parameters.
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "billing", "secret"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	auth := scram.Auth{User: "billing", Pass: "secret"}
	d := kafkabus.New(kafkabus.WithClientOpts(kgo.SASL(auth.AsSha256Mechanism())))
	// With TLS: kafkabus.New(kafkabus.WithTLS(&tls.Config{RootCAs: pool}), ...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, "kafka://"+cluster.ListenAddrs()[0], omnibus.WithDriver(d))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Publish(ctx, "orders", &omnibus.Message{Key: "customer-42", Body: []byte(`{"order":1002}`)})
	fmt.Println("published:", err == nil)
	// Output:
	// published: true
}
