package kinesisbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestBadURLs: URLs omnibus cannot use are refused before any connection
// with ErrInvalid, naming the problem, and the secret key never appears.
func TestBadURLs(t *testing.T) {
	const secret = "S3cretKEY"
	for _, raw := range []string{
		"kinesis://AKID:" + secret + "@us-east-1?shard_count=2",
		"kinesis://AKID:" + secret + "@us-east-1?failover_time=10",
		"kinesis://AKID:" + secret + "@us-east-1?failover_time=1ms",
		"kinesis://AKID:" + secret + "@us-east-1?max_records=20000",
		"kinesis://AKID:" + secret + "@us-east-1?request_timeout=1ms",
		"kinesis://AKID:" + secret + "@us-east-1?create_streams=some",
		"kinesis://AKID:" + secret + "@us-east-1?max_message_bytes=1048576",
		"kinesis://AKID:" + secret + "@us-east-1?max_message_bytes=0",
		"kinesis://AKID:" + secret + "@us-east-1?endpoint=127.0.0.1:4567",
		"kinesis://AKID:" + secret + "@US_EAST?",
		"kinesis://AKID:" + secret + "@/us-east-1",
		"kinesis://AKID:@us-east-1",
		"kinesis:/AKID:" + secret + "@us-east-1",
	} {
		t.Run(raw, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := omnibus.Open(ctx, raw)
			if err == nil {
				_ = c.Close()
				t.Fatalf("Open(%q) succeeded", raw)
			}
			if !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("error %v, want ErrInvalid", err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the secret key is in the error: %v", err)
			}
		})
	}
}

// TestUnreachable: Open fails when Kinesis does not answer, within its
// context, without the secret key in the error.
func TestUnreachable(t *testing.T) {
	const secret = "S3cretKEY"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := omnibus.Open(ctx, "kinesis://AKID:"+secret+"@us-east-1?endpoint=http://127.0.0.1:1")
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("Open of an endpoint where nothing listens: %v", err)
	}
}
