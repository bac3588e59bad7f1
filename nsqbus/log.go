package nsqbus

// go-nsq's configuration and logging, as every producer and consumer of
// a connection has them.

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus"
)

// nsqConfig is the go-nsq configuration of the connection's producers
// and consumers.
func (c *conn) nsqConfig() *nsq.Config {
	cfg := nsq.NewConfig()
	cfg.DialTimeout = c.cfg.dialTO
	cfg.MsgTimeout = c.cfg.msgTO
	cfg.LookupdPollInterval = c.cfg.poll
	cfg.AuthSecret = c.cfg.secret
	cfg.UserAgent = "omnibus-nsqbus go-nsq/" + nsq.VERSION
	// The engine decides when a message has had enough attempts (and
	// dead-letters it): go-nsq must not finish it on its own.
	cfg.MaxAttempts = 0
	// Retries are REQ without backoff: one failing message must not slow
	// the member's other messages down.
	cfg.MaxBackoffDuration = 0
	if c.cfg.outSize != 0 {
		cfg.OutputBufferSize = int64(c.cfg.outSize)
	}
	if c.cfg.outTimeout != 0 {
		cfg.OutputBufferTimeout = c.cfg.outTimeout
	}
	return cfg
}

// nsqLogger passes go-nsq's warnings and errors to the connection's
// logger, with the secret hidden.
type nsqLogger struct {
	log *slog.Logger
	raw string
}

func (c *conn) nsqLogger() nsqLogger { return nsqLogger{log: c.log, raw: c.raw} }

// Output implements go-nsq's logger. Lines start with the level (INF,
// WRN, ERR) and the producer or consumer's number. go-nsq's errors are
// warnings here (a lost connection, which it dials again), and its
// warnings information: it warns on every close of a consumer that
// holds messages ("delaying close"), which omnibus hands back itself.
func (l nsqLogger) Output(_ int, s string) error {
	s = omnibus.Redact(strings.TrimSpace(s), l.raw)
	level, rest, _ := strings.Cut(s, " ")
	msg := "go-nsq: " + strings.TrimSpace(rest)
	if level == "ERR" {
		l.log.Warn(msg)
	} else {
		l.log.Info(msg)
	}
	return nil
}

// clientError makes a go-nsq error safe to show: the secret hidden
// wherever it was quoted. The error stays reachable with errors.As when
// there was nothing to hide.
func (c *conn) clientError(err error) error {
	if err == nil || c.cfg.secret == "" {
		return err
	}
	if s := omnibus.Redact(err.Error(), c.raw); s != err.Error() {
		return errors.New(s)
	}
	return err
}
