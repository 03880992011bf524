package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/freeport"
)

// End to end: a backfill against a Redis nobody serves, with --log-format
// json, writes only JSON records to stderr, go-redis's included, and its
// final error is one too (issue 16's re-run found it plain text).
func TestJSONLogsIncludeGoRedisLines(t *testing.T) {
	t.Parallel()
	ports, err := freeport.Ports(1)
	require.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 1, 10)
	code, out, errOut := runSpate(t, dir, "", 30*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"),
		"--store", "redis://127.0.0.1:"+strconv.Itoa(ports[0]), "--connect-timeout", "1s", "--log-format", "json", "--quiet")
	require.Equal(t, exitFailed, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 2, errOut)
	goRedis := 0
	var last map[string]any
	for _, l := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), "a stderr line is not JSON: %q", l)
		if rec["component"] == "go-redis" {
			goRedis++
		}
		last = rec
	}
	assert.Positive(t, goRedis, "no go-redis record in:\n%s", errOut)
	assert.Equal(t, "ERROR", last["level"])
	assert.True(t, strings.HasPrefix(last["msg"].(string), "could not connect to redis://"), "%v", last)
	assert.EqualValues(t, exitFailed, last["exit_code"])
}
