package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// --publish is checked before anything is created: an unknown value, and
// complete with --follow (a followed split may never complete).
func TestBackfillPublishFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--publish", "sometimes"}, `--publish "sometimes": must be commit`},
		{[]string{"--publish", "complete", "--follow"}, "--publish complete needs a bounded job"},
		{[]string{"--publish", "complete", "--dst", "s3://bucket?region=x"}, "--publish applies to a directory --dst"},
	} {
		args := append([]string{"backfill", "--src", filepath.Join(dir, "src"), "--dst", filepath.Join(dir, "dst")}, c.args...)
		code, out, errOut := runSpate(t, dir, "", time.Minute, args...)
		expectCode(t, strings.Join(c.args, " "), code, exitUsage, out, errOut)
		require.Contains(t, errOut, c.want)
		require.NoDirExists(t, filepath.Join(dir, "dst"), "created before the flags were checked")
	}
}
