package main

import (
	"flag"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// Without --publish, a bounded job publishes whole files (each byte
// written once); a followed job, and a bucket --dst (whose parts ignore
// it), publish at every commit (decision 054).
func TestBackfillPublishDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, publishComplete},
		{[]string{"--follow"}, publishCommit},
		{[]string{"--dst", "s3://bucket?region=x"}, publishCommit},
		{[]string{"--publish", "commit"}, publishCommit},
		{[]string{"--publish", "complete"}, publishComplete},
	} {
		var f backfillFlags
		fs := flag.NewFlagSet("backfill", flag.ContinueOnError)
		f.register(fs)
		require.NoError(t, fs.Parse(append([]string{"--src", "src", "--dst", "dst"}, c.args...)))
		require.NoError(t, f.checkFollow(fs), "%v", c.args)
		assert.Equal(t, c.want, f.publish, "--publish with %v", c.args)
	}
}
