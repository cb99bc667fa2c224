package auth

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapLogger returns a zap logger writing to l (etcd's auth store logs with
// zap; brain with slog).
func zapLogger(l *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{l: l})
}

// slogCore is a zapcore.Core over a slog.Logger.
type slogCore struct {
	l     *slog.Logger
	attrs []any
}

func (c *slogCore) level(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.l.Enabled(context.Background(), c.level(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{l: c.l, attrs: append(append([]any(nil), c.attrs...), fieldAttrs(fields)...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	l := c.level(e.Level)
	if e.Message == simpleTokenWarning {
		// etcd warns at every start, auth on or off; brain's docs say it
		// (docs/security.md), and a warning on every start of a node
		// without auth teaches operators to ignore warnings.
		l = slog.LevelInfo
	}
	c.l.Log(context.Background(), l, e.Message, append(append([]any(nil), c.attrs...), fieldAttrs(fields)...)...)
	return nil
}

// simpleTokenWarning is what etcd's token provider logs when it starts
// with simple tokens.
const simpleTokenWarning = "simple token is not cryptographically signed"

func (c *slogCore) Sync() error { return nil }

func fieldAttrs(fields []zapcore.Field) []any {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]any, 0, 2*len(enc.Fields))
	for k, v := range enc.Fields {
		out = append(out, k, v)
	}
	return out
}
