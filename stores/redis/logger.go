package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// RouteClientLogs sends go-redis's own log lines (connection pool dial
// failures and the like), which it otherwise prints to stderr in its own
// format, to log as warnings marked component=go-redis and without
// go-redis's "redis: " prefix: with a JSON handler every line on stderr is
// JSON. go-redis's logger is process-wide, so the last call wins.
func RouteClientLogs(log *slog.Logger) {
	goredis.SetLogger(clientLogger{log: log})
}

// clientLogger is go-redis's logger over slog.
type clientLogger struct{ log *slog.Logger }

func (r clientLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(strings.TrimSpace(fmt.Sprintf(format, v...)), "redis: ")
	if ctx == nil { // go-redis passes none from some paths
		ctx = context.Background()
	}
	r.log.WarnContext(ctx, msg, "component", "go-redis")
}
