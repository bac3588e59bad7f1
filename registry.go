package omnibus

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/redact"
)

var (
	registryMu sync.RWMutex
	registry   = map[string]driver.Driver{}
)

// Register makes a driver available under a URL scheme. Transport
// packages call it from init, so a blank import is all a program needs:
//
//	import _ "github.com/omnibus-go/omnibus/kafkabus"
//
// Register panics when the scheme is empty, the driver is nil, or the
// scheme is already registered.
func Register(scheme string, d driver.Driver) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if scheme == "" || d == nil {
		panic("omnibus: Register called with an empty scheme or a nil driver")
	}
	if _, dup := registry[scheme]; dup {
		panic("omnibus: Register called twice for scheme " + scheme)
	}
	registry[scheme] = d
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

func lookup(scheme string) (driver.Driver, error) {
	registryMu.RLock()
	d := registry[scheme]
	registryMu.RUnlock()
	if d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("omnibus: scheme %q is not registered (forgotten import of its transport package?); registered: %s: %w",
		scheme, strings.Join(Schemes(), ", "), ErrUnknownScheme)
}

// RedactURL returns rawURL with its credentials hidden, for errors and
// log lines: the password of user:password becomes xxxxx, and user info
// without a password (a NATS token, or a user name alone) is hidden
// whole; so is the value of a query parameter named like a credential
// (password, token, secret_key: no transport reads one, but a user may
// write one). It takes any string, also one url.Parse rejects or one
// without a host (amqp:/user:pass@host), and never returns a credential
// of it.
// Every URL that omnibus, its transports and its command print passes
// through it.
func RedactURL(rawURL string) string { return redact.URL(rawURL) }

// Redact returns text with rawURL's credentials hidden wherever they
// appear in it: rawURL itself redacted as by [RedactURL], and any other
// occurrence of its password or token, as written, decoded or escaped,
// replaced by xxxxx. It makes a client library's message safe to show
// when that library may quote the URL it was given.
func Redact(text, rawURL string) string { return redact.Text(text, rawURL) }

// redactError returns err with rawURL's credentials hidden from its
// message; it unwraps to err.
func redactError(err error, rawURL string) error { return redact.Error(err, rawURL) }

// parseURL parses raw and returns the URL with the portable parameters
// removed, and those parameters. It refuses a URL without a host part
// (scheme:opaque, scheme:/path): a credential or a host typed with one
// slash must not become a path and send the client to a default server.
// It refuses an "@" after the host, where a "/", "?" or "#" in a
// password or token would put the rest of it: the URL would name the
// wrong host. An error never shows a credential.
func parseURL(raw string) (*url.URL, url.Values, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the input in its error: keep only the reason.
		reason := err
		var uerr *url.Error
		if errors.As(err, &uerr) {
			reason = uerr.Err
		}
		return nil, nil, fmt.Errorf("omnibus: malformed URL %q: %s: %w", RedactURL(raw), redact.Reason(reason.Error(), raw), ErrInvalid)
	}
	if u.Scheme == "" {
		return nil, nil, fmt.Errorf("omnibus: URL %q has no scheme (want e.g. kafka://host:9092): %w", RedactURL(raw), ErrInvalid)
	}
	if rest := raw[len(u.Scheme)+1:]; !strings.HasPrefix(rest, "//") {
		return nil, nil, fmt.Errorf("omnibus: URL %q has no host: want %s://host[:port]... (two slashes after the scheme): %w",
			RedactURL(raw), u.Scheme, ErrInvalid)
	}
	if after := raw[len(u.Scheme)+3:]; strings.ContainsRune(after[strings.IndexAny(after+"/", "/?#"):], '@') {
		return nil, nil, fmt.Errorf("omnibus: URL %q has an \"@\" after its host: write a \"/\", \"?\" or \"#\" in a password or token as %%2F, %%3F or %%23, and an \"@\" elsewhere as %%40: %w",
			RedactURL(raw), ErrInvalid)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("omnibus: URL %q: malformed query: %w", RedactURL(raw), ErrInvalid)
	}
	portable := url.Values{}
	for _, k := range driver.PortableParams {
		if v, ok := q[k]; ok {
			portable[k] = v
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	return u, portable, nil
}
