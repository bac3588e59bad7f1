// Package redact hides the credentials of a URL: the one implementation
// behind omnibus.RedactURL and omnibus.Redact, here so that package
// driver, which omnibus imports, can use it too.
package redact

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Mask replaces a hidden credential.
const Mask = "xxxxx"

// URL returns raw with its credentials hidden. The user info is
// everything between the scheme (and the slashes after it) and the last
// "@": a user name followed by ":" and a password keeps the name and
// loses the rest; user info without a password (a token, or a user name
// alone) is hidden whole, and so is user info whose name part holds an
// "@", as typed or escaped (%40: how url.URL writes it back), as it cannot
// be told from a host and a token before it. It works on any string, also one that url.Parse
// rejects or that has no host, so a credential typed with one slash,
// none, or an unescaped "/", "?" or "#" in it is still hidden. When a
// query value holds an "@", everything before it is hidden too: hiding
// too much is the price of not knowing.
//
// A query parameter named like a credential (see SecretParam) has its
// value hidden too: no transport reads one, but a user may write one, and
// the error that refuses it must not show it.
func URL(raw string) string {
	prefix, info, rest, ok := split(raw)
	if !ok {
		return hideQuery(raw)
	}
	if user, pass, hasPass := strings.Cut(info, ":"); hasPass && pass != "" && ShowName(user) {
		return prefix + user + ":" + Mask + hideQuery(rest)
	}
	return prefix + Mask + hideQuery(rest)
}

// SecretParam reports whether a query parameter's name says its value is
// a credential: it holds pass, pwd, secret, token, cred or auth, or ends
// in key (api_key, secret_key), in any case. A file's path named so
// (tls_key) is hidden too: hiding too much is the price of not knowing.
func SecretParam(name string) bool {
	name = strings.ToLower(name)
	for _, w := range []string{"pass", "pwd", "secret", "token", "cred", "auth"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return strings.HasSuffix(name, "key")
}

// queryParams calls fn with each name=value pair of s's query (from its
// first "?" to its "#"), as written, and the pair's value's offset in s.
func queryParams(s string, fn func(name, value string, at int)) {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return
	}
	end := len(s)
	if f := strings.IndexByte(s[q:], '#'); f >= 0 {
		end = q + f
	}
	for at := q + 1; at < end; {
		pair := s[at:end]
		if i := strings.IndexAny(pair, "&;"); i >= 0 {
			pair = pair[:i]
		}
		if raw, value, ok := strings.Cut(pair, "="); ok {
			name := raw
			if dec, err := url.QueryUnescape(raw); err == nil {
				name = dec
			}
			fn(name, value, at+len(raw)+1)
		}
		at += len(pair) + 1
	}
}

// hideQuery returns s with the values of its secret parameters hidden.
func hideQuery(s string) string {
	var b strings.Builder
	last := 0
	queryParams(s, func(name, value string, at int) {
		if value != "" && SecretParam(name) {
			b.WriteString(s[last:at])
			b.WriteString(Mask)
			last = at + len(value)
		}
	})
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// ShowName reports whether a user name given with a password may be
// shown: not when it holds an "@", as typed or escaped (%40), which
// cannot be told from a host and a token typed before it.
func ShowName(name string) bool {
	return !strings.Contains(name, "@") && !strings.Contains(strings.ToLower(name), "%40")
}

// Text returns s with rawURL's credentials hidden wherever they appear:
// rawURL itself (as written or Go-quoted) becomes URL(rawURL), then
// every remaining occurrence of a secret (the password, or a user info
// without one), as written in rawURL, decoded, escaped or Go-quoted,
// becomes Mask (a secret shorter than 6
// bytes only where it is not part of a longer word). Client libraries that quote
// a URL or a password in their errors are made safe with it.
func Text(s, rawURL string) string {
	if rawURL == "" || s == "" {
		return s
	}
	for _, form := range []string{rawURL, quoted(rawURL)} {
		if strings.Contains(s, form) {
			s = strings.ReplaceAll(s, form, URL(form))
		}
	}
	for _, secret := range Secrets(rawURL) {
		s = replaceSecret(s, secret)
	}
	return s
}

// quoted is s as it stands between the quotes of %q (strconv.Quote):
// control characters, quotes and backslashes escaped.
func quoted(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// Reason returns a parser's reason for refusing rawURL safe to show:
// Text, and then every Go-quoted piece of it that is part of rawURL's
// user info but not shown by URL(rawURL) hidden whole. url.Parse quotes
// the piece it refuses, which may be the part of a password before a
// "/" (read as a port: invalid port ":pass"), no whole secret that Text
// would find.
func Reason(s, rawURL string) string {
	s = Text(s, rawURL)
	infos := userInfos(rawURL)
	if len(infos) == 0 || !strings.Contains(s, `"`) {
		return s
	}
	shown := URL(rawURL)
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		q, err := strconv.QuotedPrefix(s[i:])
		if err != nil {
			b.WriteByte('"')
			s = s[i+1:]
			continue
		}
		s = s[i+len(q):]
		v, _ := strconv.Unquote(q)
		if v != "" && !strings.Contains(shown, v) && slices.ContainsFunc(infos, func(info string) bool { return strings.Contains(info, v) }) {
			q = strconv.Quote(Mask)
		}
		b.WriteString(q)
	}
}

// shortSecret is the length under which a secret is hidden only where it
// stands alone, not inside a longer word: a password "p" must not turn
// "open" into "oxxxxxen".
const shortSecret = 6

// replaceSecret replaces the occurrences of secret in s by Mask: all of
// them, or, for a short secret, those not inside a longer word.
func replaceSecret(s, secret string) string {
	if len(secret) >= shortSecret {
		return strings.ReplaceAll(s, secret, Mask)
	}
	var b strings.Builder
	for {
		i := strings.Index(s, secret)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(secret)
		inWord := i > 0 && isWordByte(s[i-1]) && isWordByte(secret[0]) ||
			end < len(s) && isWordByte(s[end]) && isWordByte(secret[len(secret)-1])
		b.WriteString(s[:i])
		if inWord {
			b.WriteString(secret)
		} else {
			b.WriteString(Mask)
		}
		s = s[end:]
	}
}

func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c >= 0x80
}

// Secrets returns the forms in which rawURL's secrets could appear in a
// message (as written, decoded, escaped), longest first: its user info's
// and the values of its secret query parameters (SecretParam); nil when
// it has none. Where the URL has several "@", the user info could end at
// any of them: the secret of each reading is included.
func Secrets(rawURL string) []string {
	var forms []string
	for _, secret := range readings(rawURL) {
		if user, pass, hasPass := strings.Cut(secret, ":"); hasPass && pass != "" {
			secret = pass
		} else if hasPass {
			secret = user // "user:" with an empty password: the name may be a token
		}
		if secret == "" {
			continue
		}
		forms = append(forms, secret)
		if dec, err := url.PathUnescape(secret); err == nil {
			forms = append(forms, dec)
		}
		if dec, err := url.QueryUnescape(secret); err == nil {
			forms = append(forms, dec)
		}
	}
	queryParams(rawURL, func(name, value string, _ int) {
		if value != "" && SecretParam(name) {
			forms = append(forms, value)
			if dec, err := url.QueryUnescape(value); err == nil {
				forms = append(forms, dec)
			}
		}
	})
	for _, f := range slices.Clone(forms) {
		forms = append(forms, url.PathEscape(f), url.QueryEscape(f), (&url.URL{User: url.User(f)}).String()[2:], quoted(f))
	}
	var out []string
	for _, f := range forms {
		f = strings.TrimSuffix(f, "@")
		if f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// readings returns the user info of rawURL as it reads when it ends at
// each "@" after the scheme: a parser may take any of them.
func readings(rawURL string) []string {
	prefix, _, _, ok := split(rawURL)
	if !ok {
		return nil
	}
	var infos []string
	rest := rawURL[len(prefix):]
	for i := range len(rest) {
		if rest[i] == '@' {
			infos = append(infos, rest[:i])
		}
	}
	return infos
}

// userInfos returns rawURL's longest user info, as written and decoded.
func userInfos(rawURL string) []string {
	r := readings(rawURL)
	if len(r) == 0 {
		return nil
	}
	info := r[len(r)-1]
	infos := []string{info}
	if dec, err := url.PathUnescape(info); err == nil && dec != info {
		infos = append(infos, dec)
	}
	return infos
}

// split cuts raw into the part before the user info (scheme, ":" and any
// slashes), the user info, and the rest from the last "@" on. ok is false
// when raw has no "@" after its scheme.
func split(raw string) (prefix, info, rest string, ok bool) {
	start := len(raw) - len(strings.TrimLeft(raw, " \t\r\n"))
	start += schemeEnd(raw[start:])
	for start < len(raw) && raw[start] == '/' {
		start++
	}
	at := strings.LastIndexByte(raw[start:], '@')
	if at < 0 {
		return "", "", "", false
	}
	at += start
	return raw[:start], raw[start:at], raw[at:], true
}

// schemeEnd returns the index after "scheme:" at the start of raw, or 0
// when raw does not start with a scheme.
func schemeEnd(raw string) int {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':':
			return i + 1
		default:
			return 0
		}
	}
	return 0
}

// Error returns err with rawURL's credentials hidden from its message
// (nil for nil). The result unwraps to err, so errors.Is and errors.As
// still see the client library's own error.
func Error(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if safe := Text(msg, rawURL); safe != msg {
		return &redactedError{msg: safe, err: err}
	}
	return err
}

// redactedError shows its error's message with credentials hidden.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
