package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --publish complete through the faults of the exactly-once test: three
// workers on etcd, one SIGKILLed mid-run, another SIGSTOPped past its
// lease and SIGCONTed (a zombie). Each split's file is published whole by
// renaming its staging file, and `spate verify` finds every input line
// exactly once; no staging file is left.
func TestBackfillPublishCompleteIsExactlyOnce(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	storeArgs := storeCases("etcd")[0].args(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 12, 2500)
	dst := filepath.Join(dir, "dst")
	var ws []*proc
	for i := range 3 {
		ws = append(ws, start(t, dir, "", append([]string{"backfill", "--src", src, "--dst", dst, "--job", "whole",
			"--instance", fmt.Sprintf("w%d", i), "--lease", lease.String(), "--commit-interval", "200ms",
			"--rate", "1500", "--split-bytes", "32768", "--verify=false", "--publish", "complete"}, storeArgs...)...))
	}
	t.Cleanup(func() {
		if t.Failed() { // the other workers' side of a failure
			for i, w := range ws {
				t.Logf("worker w%d stdout:\n%s\nstderr:\n%s", i, w.stdout.String(), w.stderr.String())
			}
		}
	})
	killed := ws[0]
	killed.stdout.waitFor(t, killed, "gained ", 2*time.Minute)
	require.NoError(t, killed.cmd.Process.Kill())
	<-killed.done
	var stopped *proc
	for _, w := range ws[1:] {
		select {
		case <-w.done:
			continue
		default:
		}
		if stopped == nil {
			stopped = w
		}
	}
	require.NotNil(t, stopped, "both survivors exited before the stop")
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(lease + 1500*time.Millisecond)
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGCONT))
	for _, w := range ws[1:] {
		code := w.wait(t, 3*time.Minute)
		expectCode(t, "worker", code, 0, w.stdout.String(), w.stderr.String())
	}
	require.Regexp(t, `gained \S+ \(epoch ([2-9]|[1-9][0-9]+)\)`, ws[1].stdout.String()+ws[2].stdout.String(), "no split was taken over")
	code, out, errOut := runSpate(t, dir, "", time.Minute, "verify", "--src", src, "--dst", dst)
	expectCode(t, "verify", code, 0, out, errOut)
	require.Contains(t, out, "exactly once: all "+count(int64(lines))+" input lines")
	var staged []string
	require.NoError(t, filepath.Walk(filepath.Join(dst, ".spate", "stage"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".stage") {
			staged = append(staged, p)
		}
		return nil
	}))
	require.Empty(t, staged, "staging files left after the job completed")
}

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
