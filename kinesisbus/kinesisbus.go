package kinesisbus

// The connection: Open, the Kinesis and DynamoDB clients, Capabilities,
// Close, and the classification of AWS errors into the driver's
// sentinels. conn.subs holds the open members; conn.mu the stream cache.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/smithy-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Scheme is the URL scheme kinesisbus registers.
const Scheme = "kinesis"

func init() { omnibus.Register(Scheme, Driver{}) }

// Driver is the kinesisbus driver.Driver. Programs reach it through
// omnibus.Open with a kinesis:// URL; it is exported for callers who build
// a connection themselves and hand it to omnibus.New.
type Driver struct{}

// Open implements driver.Driver: it parses u, loads the AWS configuration
// and checks that Kinesis answers (ListStreams, bounded by ctx).
func (Driver) Open(ctx context.Context, u *url.URL, opts driver.OpenOptions) (driver.Conn, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	awsCfg, err := cfg.awsConfig(ctx)
	if err != nil {
		return nil, err
	}
	// One HTTP transport for both clients, whose idle connections Close
	// closes: their goroutines end with the connection. Each call ends
	// within request_timeout whatever its context: a call on a connection
	// that stops answering would otherwise wait for ever when the context
	// has no deadline (a Publish with context.Background()). A call
	// cut short has an unknown outcome, and omnibus publishes its records
	// again, on a new connection.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	awsCfg.HTTPClient = &http.Client{Transport: tr, Timeout: cfg.requestTimeout}
	c := &conn{
		cfg:    cfg,
		logger: opts.Logger,
		known:  map[string]bool{},
		clock:  time.Now,
		http:   tr,
	}
	c.kin = kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) {
		if cfg.endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.endpoint)
		}
		// kinesisbus retries reads and records itself, with its own
		// backoff; the SDK tries each call once.
		o.Retryer = aws.NopRetryer{}
	})
	c.ddb = dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.dynamoEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.dynamoEndpoint)
		}
		// Lease writes are retried by the SDK (they are conditional, so
		// a retry that finds its own write fails the condition and is
		// read back), without the client-side quota that would turn a
		// throttled table into errors.
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) { so.RateLimiter = noLimit{} })
	})
	if _, err := c.kin.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)}); err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("kinesisbus: open %s: Kinesis did not answer: %w", cfg.redacted, c.classify(err))
	}
	return c, nil
}

// Every call a member makes to DynamoDB or Kinesis is bounded by one of
// these, derived from failover_time: the HTTP client has no timeout of
// its own, so a call on a connection that stops answering (a server that
// hangs, a network path lost under an open connection) would otherwise
// wait for ever, and the member with it: a taker that never takes a
// lease again, a reader that never reads its shard again while its lease
// is renewed. A call cut short is tried again, on a new connection.

// leaseTimeout bounds a write of a lease (a take, a hand-over, a
// renewal, a checkpoint, a release, a new lease, a finished lease
// deleted) with the read of the lease that checks a refused one: a write
// that hangs must not hold the lease's lock (shard.lmu) past its
// deadline, and one that takes longer than that leaves no time to use
// the lease anyway.
func (c *conn) leaseTimeout() time.Duration { return c.cfg.failover / 4 }

// callTimeout bounds every other call of a member (a page of the lease
// table's scan or of the shards' listing, the table's description or
// creation, a GetRecords): one taker interval, so a call that hangs
// costs the taker at most a round.
func (c *conn) callTimeout() time.Duration { return c.cfg.failover / 2 }

// noLimit is a retry rate limiter that never refuses a retry.
type noLimit struct{}

func (noLimit) GetToken(context.Context, uint) (func() error, error) {
	return func() error { return nil }, nil
}
func (noLimit) AddTokens(uint) error { return nil }

type conn struct {
	cfg    *config
	logger *slog.Logger
	kin    *kinesis.Client
	ddb    *dynamodb.Client
	http   *http.Transport  // the clients' connections
	clock  func() time.Time // time.Now; tests of the lag arithmetic set another

	subs driver.Subscribers[*sub]

	mu    sync.Mutex
	known map[string]bool // streams seen to exist
}

// MaxRecordBytes is the largest record Kinesis accepts: data and partition
// key together.
const MaxRecordBytes = 1 << 20

// envelopeOverhead bounds what the CloudEvents envelope adds to a message
// besides its body and headers' text (attribute names, quotes, the time,
// JSON escapes of ordinary headers).
const envelopeOverhead = 4096

// maxMessageBytes is the largest body any record fits, base64 included (a
// binary body grows by a third in the envelope): the default and the most
// of max_message_bytes.
const maxMessageBytes = (MaxRecordBytes - envelopeOverhead) / 4 * 3

// Capabilities implements driver.Conn. MaxMessageBytes is max_message_bytes,
// by default what any body fits in; Publish also refuses per message, with
// ErrTooLarge, a record over 1 MiB.
func (c *conn) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordered:         true,
		Lag:             driver.LagMillis,
		Age:             true,
		ExclusiveLanes:  true,
		Groups:          true,
		Replay:          true,
		MaxMessageBytes: c.cfg.maxBytes,
	}
}

func (c *conn) checkOpen(op, stream string) error {
	if c.subs.Closed() {
		return fmt.Errorf("kinesisbus: %s %q: %w", op, stream, driver.ErrClosed)
	}
	return nil
}

// Close implements driver.Conn: it closes the members still open (they
// release their leases), then the idle HTTP connections.
func (c *conn) Close() error {
	if c.subs.Close() {
		c.http.CloseIdleConnections()
	}
	return nil
}

// --- errors ---

// AWS error codes kinesisbus tells apart.
const (
	codeNotFound      = "ResourceNotFoundException"
	codeInUse         = "ResourceInUseException"
	codeThroughput    = "ProvisionedThroughputExceededException"
	codeExpired       = "ExpiredIteratorException"
	codeLimit         = "LimitExceededException"
	codeConditional   = "ConditionalCheckFailedException"
	codeAccessDenied  = "AccessDeniedException"
	codeValidation    = "ValidationException"
	codeInvalidArg    = "InvalidArgumentException"
	codeInternal      = "InternalFailure"
	codeThrottling    = "ThrottlingException"
	codeRequestLimit  = "RequestLimitExceeded"
	codeUnavailable   = "ServiceUnavailable"
	codeInternalError = "InternalServerError"
)

// errorCode is the AWS error code of err, "" when it has none.
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// throttled reports whether err is a throttling refusal, after which
// the call may be made again once the caller has backed off.
func throttled(err error) bool {
	switch errorCode(err) {
	case codeThroughput, codeLimit, codeThrottling, codeRequestLimit, "KMSThrottlingException":
		return true
	}
	return false
}

// classify wraps err with the driver sentinel that matches it, keeping the
// SDK's error reachable with errors.As, and hides the URL's secret key.
func (c *conn) classify(err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	switch code := errorCode(err); {
	case code == codeNotFound:
		sentinel = driver.ErrNotFound
	case code == codeAccessDenied, code == codeValidation, code == codeInvalidArg,
		code == "UnrecognizedClientException", code == "InvalidSignatureException":
		sentinel = driver.ErrInvalid
	case throttled(err):
		// Refused before acting.
		sentinel = driver.ErrRetryable
	case serverFailed(err):
		// Failed on the server's side, which may be after it acted (a
		// write stored, its answer lost).
		sentinel = driver.ErrOutcomeUnknown
	case code == "":
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			// No connection, so no request reached the server.
			sentinel = driver.ErrRetryable
		}
	}
	if c.cfg.secretKey != "" {
		err = redacted{err, c.cfg.redact(err.Error())}
	}
	if sentinel == nil {
		return err
	}
	return fmt.Errorf("%w: %w", err, sentinel)
}

// serverFailed reports whether err is a failure on the server's side: an
// internal error, the service unavailable, any answer of the 500s.
func serverFailed(err error) bool {
	switch errorCode(err) {
	case codeInternal, codeUnavailable, codeInternalError:
		return true
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() >= 500
}

// outcomeUnknown reports whether a write that failed with err may or may
// not have taken effect: the server failed on its side, or no answer
// came (the connection broke or timed out with the request sent, the
// call's context ended while it was out). An error with an AWS code of
// the 400s is a refusal, and a failed dial never reached the server.
func outcomeUnknown(err error) bool {
	if serverFailed(err) {
		return true
	}
	var op *net.OpError
	return errorCode(err) == "" && !(errors.As(err, &op) && op.Op == "dial")
}

// unknown is classify for an error after which a write's outcome is
// unknown (see outcomeUnknown): marked driver.ErrOutcomeUnknown.
func (c *conn) unknown(err error) error {
	err = c.classify(err)
	if errors.Is(err, driver.ErrOutcomeUnknown) {
		return err
	}
	return fmt.Errorf("%w: %w", err, driver.ErrOutcomeUnknown)
}

// redacted is an error whose text has the secret key hidden, keeping the
// original reachable with errors.As.
type redacted struct {
	err  error
	text string
}

func (r redacted) Error() string { return r.text }
func (r redacted) Unwrap() error { return r.err }

// NewKinesisClient returns an SDK Kinesis client configured as a kinesis://
// URL says (region, credentials, profile, endpoint), with the SDK's own
// retries, for a program that works on the same streams with the SDK
// beside omnibus (omnibus bench's raw baseline does). Its connections
// are its own; errors never show the secret key.
func NewKinesisClient(ctx context.Context, rawURL string) (*kinesis.Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("kinesisbus: %s: %w", omnibus.Redact(err.Error(), rawURL), driver.ErrInvalid)
	}
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	awsCfg, err := cfg.awsConfig(ctx)
	if err != nil {
		return nil, err
	}
	return kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) {
		if cfg.endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.endpoint)
		}
	}), nil
}
