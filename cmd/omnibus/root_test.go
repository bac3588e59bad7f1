package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func TestHelpHasExamples(t *testing.T) {
	for _, cmd := range []string{"", "send", "tail", "lag", "bench", "demo", "version"} {
		t.Run("cmd="+cmd, func(t *testing.T) {
			args := []string{"--help"}
			if cmd != "" {
				args = []string{cmd, "--help"}
			}
			r := runCmd(t, ctxT(t), nil, "", args...)
			wantCode(t, r, exitOK)
			if !strings.Contains(r.stdout, "Examples:") {
				t.Errorf("%s --help has no examples:\n%s", cmd, r.stdout)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"send", "--topic", "t", "--nope"}, "unknown flag: --nope"},
		{"bad flag value", []string{"send", "--topic", "t", "--count", "many"}, `invalid argument "many"`},
		{"missing topic", []string{"send", "--url", "mem://"}, "--topic is required"},
		{"missing group", []string{"lag", "--topic", "t"}, "--group is required"},
		{"bad header", []string{"send", "--topic", "t", "--header", "novalue"}, "want key=value"},
		{"size without count", []string{"send", "--topic", "t", "--size", "10"}, "need --count"},
		{"bad from", []string{"tail", "--topic", "t", "--from", "middle"}, "want earliest or latest"},
		{"bad demo size", []string{"demo", "--orders", "0"}, "must be at least 1"},
		{"extra argument", []string{"version", "extra"}, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, ctxT(t), nil, "", tt.args...)
			wantCode(t, r, exitUsage)
			wantOneLineError(t, r, tt.want, "")
		})
	}
}

// TestOpenErrorsHideCredentials: every command, on every transport,
// fails with one line that shows no password and no token, whatever the
// URL's shape; a URL without a host is refused as such, never sent to a
// local server.
func TestOpenErrorsHideCredentials(t *testing.T) {
	const secret = "s3cr3t-pw"
	tests := []struct {
		name string
		url  string
		want string
	}{
		{"unknown scheme", "bogus://alice:" + secret + "@localhost:1/x", `scheme "bogus" is not registered`},
		{"leaky driver", "leaky://alice:" + secret + "@localhost:1", "connection refused"},
		{"leaky driver token", "leaky://" + secret + "@localhost:1", "connection refused"},
		{"malformed", "nats://alice:" + secret + "@local host:1", "malformed URL"},
		{"unreachable nats", "nats://alice:" + secret + "@127.0.0.1:1?connect_timeout=500ms&max_reconnects=0", "natsbus"},
		{"unreachable nats token", "nats://" + secret + "@127.0.0.1:1?connect_timeout=500ms&max_reconnects=0", "natsbus"},
		{"unreachable kafka", "kafka://alice:" + secret + "@127.0.0.1:1?dial_timeout=500ms&request_timeout=1s", "kafkabus"},
		{"unreachable rabbitmq", "amqp://alice:" + secret + "@127.0.0.1:1/", "rabbitbus"},
		{"nats one slash", "nats:/127.0.0.2:4999", "has no host"},
		{"nats one slash token", "nats:/" + secret + "@127.0.0.2:4999", "has no host"},
		{"nats opaque token", "nats:" + secret + "@127.0.0.2:4999", "has no host"},
		{"nats empty host", "nats://" + secret + "@", "has no host"},
		{"rabbitmq one slash", "amqp:/alice:" + secret + "@127.0.0.2:5999/", "has no host"},
		{"rabbitmq opaque", "amqp:guest:" + secret + "@127.0.0.2:5999/", "has no host"},
		{"rabbitmq empty host", "amqp:///vhost", "has no host"},
		{"kafka one slash", "kafka:/alice:" + secret + "@127.0.0.2:5999", "has no host"},
		{"slash in token", "nats://" + secret + "/x@127.0.0.2:4999", `"@" after its host`},
	}
	for _, tt := range tests {
		for _, cmd := range [][]string{
			{"send", "--topic", "t", "--count", "1"},
			{"tail", "--topic", "t"},
			{"lag", "--topic", "t", "--group", "g"},
			{"bench", "--count", "1"},
			{"demo", "--orders", "10"},
		} {
			t.Run(tt.name+"/"+cmd[0], func(t *testing.T) {
				args := append(append([]string{}, cmd...), "--url", tt.url)
				r := runCmd(t, ctxT(t), nil, "", args...)
				wantCode(t, r, exitFailed)
				wantOneLineError(t, r, tt.want, secret)
				if u := omnibus.RedactURL(tt.url); strings.Count(r.stderr, u) > 1 {
					t.Errorf("stderr shows %s more than once: %s", u, r.stderr)
				}
				if r.took > 20*time.Second {
					t.Errorf("took %v to fail", r.took)
				}
			})
		}
	}
}

func TestURLFromEnvironment(t *testing.T) {
	r := runCmd(t, ctxT(t), map[string]string{"OMNIBUS_URL": "envonly://h"}, "", "send", "--topic", "t", "--count", "1")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, `scheme "envonly" is not registered`, "")

	// --url wins over the environment.
	raw, _ := memURL(t, "")
	r = runCmd(t, ctxT(t), map[string]string{"OMNIBUS_URL": "envonly://h"}, "", "send", "--url", raw, "--topic", "t", "--count", "1")
	wantCode(t, r, exitOK)
}

func TestDefaultURLIsEmbedded(t *testing.T) {
	if got := (&app{getenv: func(string) string { return "" }}).resolveURL(""); got != defaultURL() {
		t.Errorf("resolveURL(\"\") = %q, want the default %q", got, defaultURL())
	}
	r := runCmd(t, ctxT(t), nil, "one\ntwo\n", "send", "--topic", "default-url")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "sent 2, failed 0,") {
		t.Errorf("stdout = %q, want a summary of 2 sent", r.stdout)
	}
}

func TestVersion(t *testing.T) {
	r := runCmd(t, ctxT(t), nil, "", "version")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "omnibus ") || !strings.Contains(r.stdout, "mem") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("version printed %q, want one line naming the version and the transports", r.stdout)
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("a\nb  c\n"); got != "a ; b c" {
		t.Errorf("oneLine = %q", got)
	}
	_ = context.Background
}
