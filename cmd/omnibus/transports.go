package main

// The transports the command links in. A transport registers its URL
// scheme from its init function; a blank import is all it takes.
import (
	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/kafkabus"
	_ "github.com/omnibus-go/omnibus/kinesisbus"
	_ "github.com/omnibus-go/omnibus/membus"
	"github.com/omnibus-go/omnibus/natsbus"
	_ "github.com/omnibus-go/omnibus/nsqbus"
	_ "github.com/omnibus-go/omnibus/rabbitbus"
	_ "github.com/omnibus-go/omnibus/redisbus"
)

// embeddedURL is the transport used when neither --url nor OMNIBUS_URL is
// given: the zero-setup default, a NATS JetStream server inside the
// process, keeping its data in the per-user data directory
// (natsbus.DefaultDir; dir= overrides it) and shared with the other
// omnibus processes running at the same time, with topics of 4 partitions
// by default (natsbus's partitioned mode), so consumers get ordered lanes
// and per-key order. It is the only place that names the default.
var embeddedURL = natsbus.DefaultURL + "?" + defaultParams

// defaultParams are the default URL's parameters.
const defaultParams = "partitions=4"

// defaultURL returns the URL of the embedded default transport.
func defaultURL() string { return embeddedURL }

// schemes lists the registered URL schemes.
func schemes() []string { return omnibus.Schemes() }
