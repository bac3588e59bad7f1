package nsqbus

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseConfig: hosts with and without ports in both modes, the
// secret in either place of the user info, defaults and parameters.
func TestParseConfig(t *testing.T) {
	for raw, want := range map[string]config{
		"nsq://a":                       {hosts: []string{"a:4150"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://b,a:1":                   {hosts: []string{"b:4150", "a:1"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://[::1]:3":                 {hosts: []string{"[::1]:3"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://[::1]":                   {hosts: []string{"[::1]:4150"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://l1,l2:5?lookup=true":     {lookup: true, hosts: []string{"l1:4161", "l2:5"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://s3cret@a?msg_timeout=2s": {hosts: []string{"a:4150"}, secret: "s3cret", msgTO: 2 * time.Second, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://:s3cret@a?http_port=9&dial_timeout=1s&poll_interval=100ms&max_message_bytes=100": {
			hosts: []string{"a:4150"}, secret: "s3cret", httpPort: 9, maxBytes: 100, msgTO: DefaultMsgTimeout, poll: 100 * time.Millisecond, dialTO: time.Second},
		"nsq://a?envelope=binary": {hosts: []string{"a:4150"}, binary: true, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
		"nsq://a?envelope=json":   {hosts: []string{"a:4150"}, msgTO: DefaultMsgTimeout, poll: DefaultPollInterval, dialTO: DefaultDialTimeout},
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseConfig(u)
		if err != nil {
			t.Errorf("parseConfig(%q): %v", raw, err)
			continue
		}
		if got.lookup != want.lookup || !slices.Equal(got.hosts, want.hosts) || got.secret != want.secret || got.httpPort != want.httpPort ||
			got.maxBytes != want.maxBytes || got.binary != want.binary || got.msgTO != want.msgTO || got.poll != want.poll || got.dialTO != want.dialTO {
			t.Errorf("parseConfig(%q) = %+v, want %+v", raw, *got, want)
		}
	}
	for _, bad := range []string{"envelope=xml", "output_buffer_size=63", "output_buffer_size=-2", "output_buffer_timeout=0s",
		"output_buffer_size=-1&output_buffer_timeout=50ms"} {
		if _, err := parseConfig(&url.URL{Scheme: "nsq", Host: "a", RawQuery: bad}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	type buffer struct {
		size    int
		timeout time.Duration
	}
	for query, want := range map[string]buffer{
		"":                           {-1, 0},
		"output_buffer_size=-1":      {-1, 0},
		"output_buffer_size=16384":   {16384, 0},
		"output_buffer_timeout=50ms": {0, 50 * time.Millisecond},
		"output_buffer_size=64&output_buffer_timeout=1s": {64, time.Second},
	} {
		got, err := parseConfig(&url.URL{Scheme: "nsq", Host: "a", RawQuery: query})
		if err != nil {
			t.Errorf("%q: %v", query, err)
			continue
		}
		if (buffer{got.outSize, got.outTimeout}) != want {
			t.Errorf("%q: output buffer %d, %v, want %d, %v", query, got.outSize, got.outTimeout, want.size, want.timeout)
		}
		// What go-nsq sends in IDENTIFY: go-nsq's own for what is not set.
		nc := (&conn{cfg: got}).nsqConfig()
		if want.size == 0 {
			want.size = 16384
		}
		if want.timeout == 0 {
			want.timeout = 250 * time.Millisecond
		}
		if (buffer{int(nc.OutputBufferSize), nc.OutputBufferTimeout}) != want {
			t.Errorf("%q: go-nsq's output buffer %d, %v, want %d, %v", query, nc.OutputBufferSize, nc.OutputBufferTimeout, want.size, want.timeout)
		}
	}
	cfg := &config{}
	if got := cfg.httpAddr("h:4150"); got != "h:4151" {
		t.Errorf("HTTP address of h:4150 = %s, want h:4151", got)
	}
	cfg.httpPort = 80
	if got := cfg.httpAddr("h:4150"); got != "h:80" {
		t.Errorf("HTTP address of h:4150 with http_port=80 = %s, want h:80", got)
	}
}

// TestNames: names NSQ takes stay as they are; longer ones are cut with
// a hash, the same every time, different for different names.
func TestNames(t *testing.T) {
	if n, err := topicName("orders.eu_1-x"); err != nil || n != "orders.eu_1-x" {
		t.Errorf("topicName = %q, %v", n, err)
	}
	long1, long2 := "x"+strings.Repeat("a", 99), "y"+strings.Repeat("a", 99)
	a, _ := topicName(long1)
	b, _ := topicName(long1)
	c, _ := topicName(long2)
	if len(a) != maxName || a != b || a == c {
		t.Errorf("long names: %q (%d bytes), %q, %q", a, len(a), b, c)
	}
	ch, err := channelName(long1, true)
	if err != nil || len(ch) != maxName || ch[len(ch)-len(ephemeralSuffix):] != ephemeralSuffix {
		t.Errorf("ephemeral channel of a long group: %q, %v", ch, err)
	}
	for _, bad := range []string{"", "a b", "a/b", "a#b", "ä"} {
		if _, err := topicName(bad); err == nil {
			t.Errorf("topicName(%q) succeeded", bad)
		}
	}
}
