package kafkabus

// Logging: franz-go's warnings and errors go to the client's logger.

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger hands franz-go's warnings and errors to the client's logger;
// its info and debug lines (every metadata refresh, every join) stay out.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	k.l.Log(context.Background(), lv, msg, keyvals...)
}
