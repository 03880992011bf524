package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// redisLogger sends go-redis's own log lines (connection pool dial
// failures and the like), which it otherwise prints to stderr in its own
// format, through the command's slog logger: with --log-format json every
// line on stderr is JSON.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(strings.TrimSpace(fmt.Sprintf(format, v...)), "redis: ")
	r.log.WarnContext(orBackground(ctx), msg, "component", "go-redis")
}

// orBackground is ctx, or Background when go-redis passes none.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// routeRedisLogs makes log the destination of go-redis's log lines (a
// process-wide setting of go-redis).
func routeRedisLogs(log *slog.Logger) {
	goredis.SetLogger(redisLogger{log: log})
}
