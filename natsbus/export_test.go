package natsbus

import (
	"context"
	"log/slog"
	"net/url"

	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus/driver"
)

// OpenConn opens rawURL as omnibus.Open would and also returns the NATS
// connection, so a test can cut it as a crash would.
func OpenConn(ctx context.Context, rawURL string) (driver.Conn, *nats.Conn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, err
	}
	q := u.Query()
	q.Del("durability")
	u.RawQuery = q.Encode()
	c, err := Driver{}.Open(ctx, u, driver.OpenOptions{Logger: slog.Default()})
	if err != nil {
		return nil, nil, err
	}
	return c, c.(*conn).nc, nil
}

// FailNextRead fails the next read of any lane's pump as a missed
// heartbeat would, dropping the message read.
func FailNextRead() { failNextRead.Store(true) }

// LeaseBucket is the KV bucket of group's partition leases on topic.
func LeaseBucket(topic, group string) string { return leaseBucket(streamName(topic), group) }

// StreamName is the stream that holds topic.
func StreamName(topic string) string { return streamName(topic) }

// PositionBucket is the KV bucket of group's positions on topic.
func PositionBucket(topic, group string) string { return positionBucket(streamName(topic), group) }
