package main

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/storeurl"
)

// spate jobs lists a Redis store's jobs (--long with their state); spate
// delete refuses a job with a live worker and touches none of its keys,
// deletes it with --force, and deletes every key of a job on a yes, as the
// store's own keys show. The same commands' output, and a worker in
// another process, are transcripts (testdata/script/jobs.txtar and
// live.txtar).
func TestJobsAndDeleteOnRedis(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	storeURL := "redis://" + srv.Addr()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 3, 200)
	code, out, errOut := runSpate(t, dir, "", 90*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"),
		"--store", storeURL, "--job", "finished", "--lease", "1s", "--split-bytes", "8192", "--quiet")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)

	// A worker of job "running", alive in this process.
	st, err := storeurl.OpenStore(ctxT(t, 10*time.Second), storeURL, "running", time.Second, storeurl.Options{})
	require.NoError(t, err)
	defer st.Close()
	cfg := spate.TimingsForLease(time.Second)
	cfg.InstanceID = "live-worker"
	coord, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	coord.SetWaker(spate.InertWaker())
	require.NoError(t, coord.Start(filesource.NewPlanner(filesource.Dir(src), filesource.PlannerOptions{TargetBytes: 8192, MaxFiles: 2})))
	defer coord.Close()
	require.Eventually(t, func() bool {
		ids, err := spate.LiveWorkers(t.Context(), st)
		return err == nil && len(ids) == 1
	}, 10*time.Second, 20*time.Millisecond)

	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "jobs", "--store", storeURL)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "finished\nrunning\n", out)
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "jobs", "--store", storeURL, "--long")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^JOB\s+STATE\s+SPLITS\s+WORKERS$`, out)
	assert.Regexp(t, `(?m)^finished\s+complete\s+(\d+)/(\d+)\s+0$`, out)
	assert.Regexp(t, `(?m)^running\s+\S+\s+\S+\s+1$`, out)

	// Refused while the worker lives, even with --yes.
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "delete", "--store", storeURL, "--job", "running", "--yes")
	assert.Equal(t, exitFailed, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, errOut, "job running has 1 live worker(s): live-worker; stop them first")
	assert.Contains(t, errOut, "--force")
	ok, err := srv.Client(t).Exists(t.Context(), "spate:{running}:meta").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, ok, "a refused delete deleted")

	// --force deletes it, warning about the worker.
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "delete", "--store", storeURL, "--job", "running", "--force", "--yes")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, out, "warning: job running has 1 live worker(s): live-worker")
	assert.Contains(t, out, "deleted job running from redis://"+srv.Addr())
	keys, err := srv.Client(t).Keys(t.Context(), "spate:{running}:*").Result()
	require.NoError(t, err)
	// The live worker may write its presence again before it notices.
	for _, k := range keys {
		assert.True(t, strings.Contains(k, ":e:"), "key %s survived the delete", k)
	}

	// A yes deletes every key of the job. (The prompt, a no, no answer and
	// a job that is not there are transcripts: testdata/script/jobs.txtar.)
	code, out, errOut = runSpate(t, dir, "y\n", 30*time.Second, "delete", "--store", storeURL, "--job", "finished")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	keys, err = srv.Client(t).Keys(t.Context(), "spate:{finished}:*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys)
}

// delete names its job explicitly; jobs and delete refuse a store that
// lives inside another process.
func TestJobsAndDeleteRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, out, errOut := runSpate(t, dir, "", 30*time.Second, "delete", "--store", "mem://")
	assert.Equal(t, exitUsage, code, out)
	assert.Contains(t, errOut, "spate delete: --job is required (or --src)")
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "jobs", "--store", "bogus://x")
	assert.Equal(t, exitUsage, code, out)
	assert.Contains(t, errOut, `unknown scheme "bogus"`)
	for _, args := range [][]string{{"jobs"}, {"delete", "--job", "j", "--yes"}} {
		code, out, errOut = runSpate(t, dir, "", 30*time.Second, append(args, "--store", "mem://")...)
		assert.Equal(t, exitFailed, code, out)
		assert.Contains(t, errOut, "in-process memory store (mem://): this process only: there is nothing to inspect from another process")
	}
}
