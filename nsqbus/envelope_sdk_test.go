package nsqbus

import (
	"encoding/json"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"

	"github.com/omnibus-go/omnibus/driver"
)

// TestEnvelopeTextBodySDK: the CloudEvents SDK reads a text body sent as
// a JSON string, and the time, as written.
func TestEnvelopeTextBodySDK(t *testing.T) {
	when := time.Date(2026, 12, 3, 12, 30, 41, 281706000, time.UTC)
	m := driver.Message{ID: "t", Source: "/s", Type: "x", Time: when, ContentType: "text/plain", Body: []byte("hello é")}
	raw := encode(nil, &m)
	var e cloudevents.Event
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("the SDK cannot read %s: %v", raw, err)
	}
	if string(e.Data()) != "hello é" || !e.Time().Equal(when) || e.DataContentType() != "text/plain" {
		t.Errorf("the SDK read %s as data %q, time %v, content type %q", raw, e.Data(), e.Time(), e.DataContentType())
	}
}
