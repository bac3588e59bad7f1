package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/spf13/cobra"
)

// openTimeout bounds connecting to a transport, so an unreachable server is
// an error within seconds.
const openTimeout = 15 * time.Second

// addURLFlag adds --url to cmd.
func addURLFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "url", "", "transport URL (default $OMNIBUS_URL, else the embedded default)")
}

// resolveURL picks the URL: the flag, then OMNIBUS_URL, then the embedded
// default.
func (a *app) resolveURL(flag string) string {
	raw := flag
	if raw == "" {
		raw = a.getenv("OMNIBUS_URL")
	}
	if raw == "" {
		raw = defaultURL()
	}
	a.rawURL = raw
	return raw
}

// open connects to the transport named by the flag, OMNIBUS_URL or the
// default.
func (a *app) open(ctx context.Context, flag string, opts ...omnibus.Option) (*omnibus.Client, error) {
	raw := a.resolveURL(flag)
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	type opened struct {
		c   *omnibus.Client
		err error
	}
	done := make(chan opened, 1)
	go func() { // ends with octx at the latest
		c, err := omnibus.Open(octx, raw, opts...)
		done <- opened{c, err}
	}()
	var r opened
	select {
	case r = <-done:
		// ErrInvalid is a bad URL, not worth a look, except from
		// nsqbus, which says so of a server that does not speak NSQ.
		if r.err == nil || errors.Is(r.err, omnibus.ErrUnknownScheme) ||
			errors.Is(r.err, omnibus.ErrInvalid) && scheme(raw) != "nsq" {
			return r.c, r.err
		}
	case <-time.After(probeAfter):
	}
	// Slow or failed: when the port speaks another protocol, say so now.
	if werr := wrongProtocol(octx, raw); werr != nil {
		cancel()
		if r.c == nil && r.err == nil {
			select {
			case r = <-done:
			default: // a client library may not heed ctx while it waits for the server's answer
				go func() { // ends when Open returns, within openTimeout
					if r := <-done; r.c != nil {
						_ = r.c.Close()
					}
				}()
			}
		}
		if r.c != nil {
			return r.c, nil // it opened after all
		}
		return nil, fmt.Errorf("omnibus: open %s: %w", omnibus.RedactURL(raw), werr)
	}
	if r.c == nil && r.err == nil {
		r = <-done
	}
	return r.c, r.err
}

// topicExister is implemented by a transport connection that can tell
// whether a topic exists without creating it.
type topicExister interface {
	TopicExists(ctx context.Context, topic string) (bool, error)
}

// topicDeleter is implemented by a transport connection that can remove
// a topic, with its messages, and a consumer group's state on a topic; a
// topic or group that does not exist is no error.
type topicDeleter interface {
	DeleteTopic(ctx context.Context, topic string) error
	DeleteGroup(ctx context.Context, topic, group string) error
}

// noteProcessLocal says, for a transport that lives inside the process
// (mem://), that what the command sends or reads ends with it: commands
// that hand messages to other commands (send, tail, lag) call it.
func (a *app) noteProcessLocal() {
	if scheme(a.rawURL) == "mem" {
		fmt.Fprintln(a.stderr, "omnibus: note: mem:// lives only in this process: its messages are gone when the command ends (the default URL keeps them, for the next command)")
	}
}

// openScratch opens the transport for a command that makes its own
// topics and needs none of them afterwards (bench, demo). On the default
// URL it runs the embedded server on a temporary store, removed when done
// is called, so the user's data directory keeps nothing of it; elsewhere
// it opens the URL as open does, and scratch is false: what the command
// makes stays there. done closes the client.
func (a *app) openScratch(ctx context.Context, flag string) (c *omnibus.Client, scratch bool, done func(), err error) {
	if flag == "" && a.getenv("OMNIBUS_URL") == "" {
		dir, err := os.MkdirTemp("", "omnibus-scratch-")
		if err != nil {
			return nil, false, nil, err
		}
		c, err := a.open(ctx, natsbus.EmbeddedURL(dir)+"&"+defaultParams)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, false, nil, err
		}
		a.name = defaultURL() + " on a temporary store"
		return c, true, func() {
			a.closeClient(c)
			_ = os.RemoveAll(dir)
		}, nil
	}
	c, err = a.open(ctx, flag)
	if err != nil {
		return nil, false, nil, err
	}
	return c, scheme(a.rawURL) == "mem", func() { a.closeClient(c) }, nil
}

// urlName is the URL the command uses, as it shows it.
func (a *app) urlName() string {
	if a.name != "" {
		return a.name
	}
	return omnibus.RedactURL(a.rawURL)
}

// scheme returns the scheme of raw, or raw itself when it has none.
func scheme(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return raw
	}
	return u.Scheme
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// closeClient closes c, reporting a failure on stderr only: the command's
// own result matters more.
func (a *app) closeClient(c *omnibus.Client) {
	if err := c.Close(); err != nil {
		fmt.Fprintln(a.stderr, "omnibus: close:", oneLine(omnibus.Redact(err.Error(), a.rawURL)))
	}
}
