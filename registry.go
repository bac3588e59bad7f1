package omnibus

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/omnibus-go/omnibus/driver"
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

// parseURL parses raw and returns the URL with the portable parameters
// removed, and those parameters. An error never shows the password.
func parseURL(raw string) (*url.URL, url.Values, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the input in its error: keep only the reason.
		var uerr *url.Error
		reason := err
		if ok := asURLError(err, &uerr); ok {
			reason = uerr.Err
		}
		return nil, nil, fmt.Errorf("omnibus: malformed URL %q: %v: %w", redactRaw(raw), reason, ErrInvalid)
	}
	if u.Scheme == "" {
		return nil, nil, fmt.Errorf("omnibus: URL %q has no scheme (want e.g. kafka://host:9092): %w", u.Redacted(), ErrInvalid)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("omnibus: URL %q: malformed query: %w", u.Redacted(), ErrInvalid)
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

func asURLError(err error, target **url.Error) bool {
	ue, ok := err.(*url.Error)
	if ok {
		*target = ue
	}
	return ok
}

// redactRaw hides a password in a URL that url.Parse rejected.
func redactRaw(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	userinfo := rest[:at]
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":xxxxx" + rest[at:]
	}
	return raw
}
