package console_test

import (
	"context"
	"net/http"

	"github.com/omnibus-go/omnibus/console"
	_ "github.com/omnibus-go/omnibus/kafkabus"
)

// A console on Kafka for group billing of topic orders, served on
// loopback, read-only.
func Example() {
	ctx := context.Background()
	srv, err := console.New(console.Options{Sources: []console.Source{{
		URL: "kafka://localhost:9092", Topics: []string{"orders"}, Groups: []string{"billing"},
	}}})
	if err != nil {
		panic(err)
	}
	go srv.Run(ctx)
	_ = http.ListenAndServe("127.0.0.1:9480", srv.Handler())
}
