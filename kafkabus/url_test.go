package kafkabus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
)

// TestHostlessURLsAreRefused: a URL whose broker list is missing (one
// slash, none, three, empty entries) or swallowed by an unescaped "/" in
// a password is an error that names the problem and hides the password,
// before any connection. A broker on franz-go's default address
// (127.0.0.1:9092), where a client without seeds would go, sees no
// topic.
func TestHostlessURLsAreRefused(t *testing.T) {
	const secret = "S3cretPW"
	var local *kfake.Cluster
	if c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(9092), kfake.AllowAutoTopicCreation()); err == nil {
		local = c
		t.Cleanup(c.Close)
	} else {
		t.Logf("port 9092 is taken (%v): not checking what a default broker would have received", err)
	}
	urls := []string{
		"kafka:/alice:" + secret + "@127.0.0.2:5999",
		"kafka:alice:" + secret + "@127.0.0.2:5999",
		"kafka:/127.0.0.2:5999",
		"kafka:///127.0.0.2:5999",
		"kafka:///alice:" + secret + "@127.0.0.2:5999",
		"kafka://",
		"kafka://,",
		"kafka://alice:pw/" + secret + "@127.0.0.2:5999",
		"kafka://alice/" + secret + "@127.0.0.2:5999",
		"kafkas:/alice:" + secret + "@127.0.0.2:5999",
	}
	for _, raw := range urls {
		t.Run(raw, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			c, err := omnibus.Open(ctx, raw)
			if err == nil {
				perr := c.Publish(ctx, "misrouted", &omnibus.Message{Body: []byte("x")})
				_ = c.Close()
				t.Fatalf("Open(%q) succeeded, want an error; published: %v", raw, perr)
			}
			if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "host") && !strings.Contains(err.Error(), "broker") {
				t.Errorf("Open(%q) = %v, want ErrInvalid naming the missing broker address", raw, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q) shows the password: %v", raw, err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("Open(%q) took %v to refuse: it tried to connect", raw, took)
			}
		})
	}
	if local == nil {
		return
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(local.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := topics.Names(); len(names) != 0 {
		t.Errorf("the broker on 127.0.0.1:9092 has topics %v: a URL reached it", names)
	}
}
