// Package fuzztest is what the fuzz targets share: URLs that carry a
// marked secret, for the targets that check that no error shows a
// credential (this file), and messages built from fuzz input and
// compared, for the targets that check that a transport's encoding
// round-trips (messages.go). Only tests import it.
package fuzztest

// A URL here has a password (or token) carrying Marker, in any of the
// shapes credentials get typed in (one slash or none after the scheme,
// "/", "?", "#", "@" or "%" inside the password, odd schemes, hosts and
// queries). A password may be cut anywhere by a parser, so Marker sits
// inside it, between two fuzzed parts: an error that shows it shows the
// password's middle.

import (
	"net/url"
	"strings"
	"testing"
)

// Marker is the part of every fuzzed password that no error may show.
// Letters and digits only, so that no escaping changes it.
const Marker = "Zq7Secret"

// URL returns scheme ":" slashes userinfo "@" rest, where userinfo is
// user ":" pass1 Marker pass2, or, for a token, pass1 Marker pass2
// alone. ok is false when a part holds Marker itself (or most of it), as
// then an error could show it without showing the password, and for a
// token with a ":" in it, which is a user name and a password.
func URL(scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) (raw string, ok bool) {
	for _, part := range []string{scheme, user, pass1, pass2, rest} {
		if strings.Contains(strings.ToLower(part), strings.ToLower(Marker[2:])) {
			return "", false
		}
	}
	info := user + ":" + pass1 + Marker + pass2
	if token {
		if strings.Contains(pass1+pass2, ":") {
			return "", false // user:password, whatever was meant
		}
		info = pass1 + Marker + pass2
	}
	return scheme + ":" + strings.Repeat("/", int(slashes%4)) + info + "@" + rest, true
}

// Check fails t when text shows Marker, naming what showed it.
func Check(t *testing.T, what, raw, text string) {
	t.Helper()
	if strings.Contains(text, Marker) {
		t.Errorf("%s shows the password of %q: %s", what, raw, text)
	}
}

// Seed adds the shapes every URL fuzz target starts from, for a target
// taking (scheme, slashes, user, pass1, pass2, rest, token).
func Seed(f *testing.F, schemes ...string) {
	for _, s := range schemes {
		f.Add(s, uint8(2), "alice", "pw", "", "127.0.0.1:1/", false)
		f.Add(s, uint8(2), "alice", "p/w", "", "127.0.0.1:1/x?a=b", false)          // "/" in a password
		f.Add(s, uint8(2), "alice", "x", "y/z", "127.0.0.1:1", false)               // the password cut before "/"
		f.Add(s, uint8(1), "alice", "pw", "", "127.0.0.1:1", false)                 // one slash
		f.Add(s, uint8(0), "alice", "pw", "", "127.0.0.1:1", false)                 // none
		f.Add(s, uint8(3), "", "tok", "en", "127.0.0.1:1", true)                    // a token, three slashes
		f.Add(s, uint8(2), "", "t?o", "k#en", "h:1?x=@y", true)                     // "?" and "#" in a token, "@" in the query
		f.Add(s, uint8(2), "al@ice", "p@w", "%zz", "h:1", false)                    // "@" and a bad escape
		f.Add(s, uint8(2), "alice", "p\x01", "\"w", "h:1", false)                   // a control character and a quote
		f.Add(s, uint8(2), "alice", "pw", "", "h1:1,h2:2?tls_server_name=%", false) // a bad query
	}
}

// Parse is url.Parse for a transport's URL parser, which is handed any
// URL that url.Parse takes: ok is false when url.Parse refuses raw, and
// when the query has a parameter named in files: they name files the
// parser would read, and a fuzzer must not make it read /dev/zero.
func Parse(raw string, files ...string) (u *url.URL, ok bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, false
	}
	q := u.Query()
	for _, name := range files {
		if q.Has(name) {
			return nil, false
		}
	}
	return u, true
}

// ParserTarget is the fuzz target of a transport's URL parser: parse is
// given every URL url.Parse takes of those the fuzzer builds (see URL;
// not those with a query parameter named in files), and neither its
// error nor what it returns for errors and logs to show (the redacted
// URL, what names the credentials) may show the password.
func ParserTarget(f *testing.F, schemes, files []string, parse func(*url.URL) (shown []string, err error)) {
	Seed(f, schemes...)
	f.Fuzz(func(t *testing.T, scheme string, slashes uint8, user, pass1, pass2, rest string, token bool) {
		raw, ok := URL(scheme, slashes, user, pass1, pass2, rest, token)
		if !ok {
			return
		}
		u, ok := Parse(raw, files...)
		if !ok {
			return
		}
		shown, err := parse(u)
		if err != nil {
			Check(t, "the parser's error", raw, err.Error())
		}
		for _, s := range shown {
			Check(t, "the parser's result", raw, s)
		}
	})
}
