package kinesisbus

// Configuration: the URL's parameters with their defaults and the names
// AWS and the KCL give them, parsed once by Open, and the AWS SDK
// configuration they become. Read-only after Open.

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the URL parameters; see the package documentation.
const (
	DefaultLeaseTable        = "{stream}.{group}"
	DefaultFailoverTime      = 10 * time.Second
	DefaultShardSyncInterval = time.Minute
	DefaultPollInterval      = time.Second
	DefaultMaxRecords        = 10000
	DefaultRequestTimeout    = 30 * time.Second
	DefaultDLQSuffix         = ".dlq"
)

// Values of the create_streams parameter.
const (
	CreateNone = "none" // never create a stream on first use
	CreateDLQ  = "dlq"  // create dead-letter streams (name ends in ".dlq") only
	CreateAll  = "all"  // create any stream on first use
)

// params are the URL query parameters kinesisbus knows, in documentation
// order.
var params = []string{
	"endpoint", "dynamodb_endpoint", "profile",
	"lease_table", "failover_time", "shard_sync_interval",
	"poll_interval", "max_records", "create_streams", "shards",
	"max_message_bytes", "request_timeout",
}

// config is a parsed URL.
type config struct {
	region   string
	redacted string

	endpoint       string
	dynamoEndpoint string
	profile        string
	accessKey      string
	secretKey      string
	leaseTable     string
	failover       time.Duration
	shardSync      time.Duration
	pollInterval   time.Duration
	maxRecords     int32
	createStreams  string
	shards         int32
	maxBytes       int // Capabilities' MaxMessageBytes
	requestTimeout time.Duration
}

func invalid(u *url.URL, format string, args ...any) error {
	return fmt.Errorf("kinesisbus: URL %q: %s: %w", omnibus.RedactURL(u.String()), fmt.Sprintf(format, args...), driver.ErrInvalid)
}

var regionName = regexp.MustCompile(`^[a-z0-9-]+$`)

// parseURL reads u into a config. It rejects unknown parameters and bad
// values with errors wrapping driver.ErrInvalid; the secret key never
// appears in them.
func parseURL(u *url.URL) (*config, error) {
	if u.Scheme != Scheme {
		return nil, invalid(u, "scheme %q, want %s", u.Scheme, Scheme)
	}
	if err := driver.CheckParams(u, params...); err != nil {
		return nil, fmt.Errorf("kinesisbus: %w", err)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, invalid(u, "no region (want %s://region[?param=value...], such as %s://us-east-1)", Scheme, Scheme)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, invalid(u, "unexpected path (a \"/\" in a secret key must be written %%2F)")
	}
	if !regionName.MatchString(u.Host) {
		return nil, invalid(u, "region %q: want lowercase letters, digits and dashes (us-east-1)", u.Hostname())
	}
	c := &config{
		region:        u.Host,
		redacted:      omnibus.RedactURL(u.String()),
		leaseTable:    DefaultLeaseTable,
		failover:      DefaultFailoverTime,
		shardSync:     DefaultShardSyncInterval,
		pollInterval:  DefaultPollInterval,
		maxRecords:    DefaultMaxRecords,
		createStreams: CreateDLQ,
		shards:        1,
		maxBytes:      maxMessageBytes,

		requestTimeout: DefaultRequestTimeout,
	}
	if u.User != nil {
		c.accessKey = u.User.Username()
		c.secretKey, _ = u.User.Password()
		if c.accessKey == "" || c.secretKey == "" {
			return nil, invalid(u, "credentials in the URL need both an access key id and a secret key (kinesis://KEYID:SECRET@region)")
		}
	}
	q := u.Query()
	get := func(name string) (string, bool) {
		vs, ok := q[name]
		if !ok {
			return "", false
		}
		return vs[len(vs)-1], true
	}
	for _, p := range []struct {
		name string
		dst  *string
	}{{"endpoint", &c.endpoint}, {"dynamodb_endpoint", &c.dynamoEndpoint}} {
		v, ok := get(p.name)
		if !ok {
			continue
		}
		e, err := url.Parse(v)
		if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return nil, invalid(u, "%s %q: want an http:// or https:// URL", p.name, v)
		}
		*p.dst = v
	}
	if c.dynamoEndpoint == "" && c.endpoint != "" {
		// One local endpoint for both is what emulators that serve both
		// (LocalStack) want.
		c.dynamoEndpoint = c.endpoint
	}
	if v, ok := get("profile"); ok {
		c.profile = v
	}
	if v, ok := get("lease_table"); ok {
		if v == "" {
			return nil, invalid(u, "lease_table is empty")
		}
		c.leaseTable = v
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
		min  time.Duration
	}{
		{"failover_time", &c.failover, 300 * time.Millisecond},
		{"shard_sync_interval", &c.shardSync, 100 * time.Millisecond},
		{"poll_interval", &c.pollInterval, time.Millisecond},
		{"request_timeout", &c.requestTimeout, 100 * time.Millisecond},
	} {
		v, ok := get(d.name)
		if !ok {
			continue
		}
		x, err := time.ParseDuration(v)
		if err != nil || x < d.min {
			return nil, invalid(u, "%s %q: want a duration of at least %v (such as 10s)", d.name, v, d.min)
		}
		*d.dst = x
	}
	if v, ok := get("max_records"); ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > 10000 {
			return nil, invalid(u, "max_records %q: want 1 to 10000 (GetRecords' Limit)", v)
		}
		c.maxRecords = int32(n)
	}
	if v, ok := get("create_streams"); ok {
		switch v {
		case CreateNone, CreateDLQ, CreateAll:
			c.createStreams = v
		default:
			return nil, invalid(u, "create_streams %q: want %s, %s or %s", v, CreateNone, CreateDLQ, CreateAll)
		}
	}
	if v, ok := get("shards"); ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			return nil, invalid(u, "shards %q: want a positive shard count", v)
		}
		c.shards = int32(n)
	}
	if v, ok := get("max_message_bytes"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxMessageBytes {
			return nil, invalid(u, "max_message_bytes %q: want 1 to %d (what fits in a record of Kinesis's 1 MiB)", v, maxMessageBytes)
		}
		c.maxBytes = n
	}
	return c, nil
}

// awsConfig loads the SDK's configuration: the default credential chain
// (environment, shared files, the profile, a role), or the URL's static
// keys when it has them.
func (c *config) awsConfig(ctx context.Context) (aws.Config, error) {
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(c.region)}
	if c.profile != "" {
		opts = append(opts, awsconfig.WithSharedConfigProfile(c.profile))
	}
	if c.accessKey != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.accessKey, c.secretKey, "")))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("kinesisbus: open %s: AWS configuration: %s: %w", c.redacted, c.redact(err.Error()), driver.ErrInvalid)
	}
	return cfg, nil
}

// redact hides the URL's secret key in s.
func (c *config) redact(s string) string {
	if c.secretKey == "" {
		return s
	}
	return strings.ReplaceAll(s, c.secretKey, "xxxxx")
}

// tableName is the lease table of group on stream.
func (c *config) tableName(stream, group string) string {
	return strings.NewReplacer("{stream}", stream, "{group}", group).Replace(c.leaseTable)
}
