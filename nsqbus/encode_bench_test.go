package nsqbus

import (
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// BenchmarkEncodeBatch measures the client's part of a publish without
// a server: encoding a batch of 100 messages (binary bodies, so base64
// in JSON, with an ID and a time) into an MPUB body, in each envelope.
func BenchmarkEncodeBatch(b *testing.B) {
	for _, env := range []string{"json", "binary"} {
		for _, size := range []int{100, 1024} {
			benchmarkEncodeBatch(b, env, size)
		}
	}
}

func benchmarkEncodeBatch(b *testing.B, env string, size int) {
	{
		b.Run(fmt.Sprintf("%s/%dB", env, size), func(b *testing.B) {
			ms := make([]*driver.Message, 100)
			for i := range ms {
				ms[i] = &driver.Message{ID: "3c17fdf3cbf721c0c2-1", Time: time.Now(), Body: make([]byte, size)}
			}
			c := &conn{cfg: &config{binary: env == "binary"}}
			c.limits.maxBody, c.limits.maxMsg = 5<<20, 1<<20
			errs := make([]error, len(ms))
			b.ReportAllocs()
			for b.Loop() {
				c.encodeBatches("t", ms, errs, func(b *batch) { putBatch(b) }) // as Publish does once answered
			}
		})
	}
}
