package redis

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// go-redis's log lines become slog records: JSON with a JSON handler,
// without go-redis's own "redis: " prefix, marked with their component.
func TestClientLoggerWritesSlogRecords(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	clientLogger{log: log}.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %s", 5, "refused")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec), buf.String())
	assert.Equal(t, "WARN", rec["level"])
	assert.Equal(t, "connection pool: failed to dial after 5 attempts: refused", rec["msg"])
	assert.Equal(t, "go-redis", rec["component"])
}
