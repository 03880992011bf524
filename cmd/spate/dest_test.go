package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/mem"
)

// --dst, --data-dir and --history inside --src are refused however they
// are reached: through a symbolic link to --src (or to a directory inside
// it), and before the directory they name exists.
func TestBackfillEndsOverlapThroughLinks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 1, 3)
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(src, link))
	elsewhere := filepath.Join(dir, "elsewhere")
	require.NoError(t, os.Mkdir(elsewhere, 0o755))
	linkToOut := filepath.Join(dir, "out-link") // a link, in the parent of --dst, to a directory of --src
	require.NoError(t, os.Symlink(filepath.Join(src, "part-0"), linkToOut))

	in, err := openInput(context.Background(), src)
	require.NoError(t, err)
	defer in.close()
	overlap := func(dst, dataDir, history string) string {
		t.Helper()
		out, err := openOutput(context.Background(), dst)
		require.NoError(t, err)
		f := backfillFlags{history: history}
		f.store.dataDir = dataDir
		return f.endsOverlap(in, out)
	}
	safe := filepath.Join(elsewhere, "dst")
	data := filepath.Join(elsewhere, "etcd")
	assert.Empty(t, overlap(safe, data, ""), "separate ends refused")
	assert.Empty(t, overlap(safe, data, filepath.Join(elsewhere, "h.jsonl")), "a history elsewhere refused")
	for _, dst := range []string{
		filepath.Join(src, "out"),
		filepath.Join(link, "out"),
		filepath.Join(link, "new", "deeper"),
		filepath.Join(linkToOut, "out"),
		link,
	} {
		assert.Contains(t, overlap(dst, data, ""), "--src and --dst must not contain each other", "--dst %s", dst)
	}
	// A --dst that holds --src through a link is refused too.
	dstLink := filepath.Join(elsewhere, "dst-link")
	require.NoError(t, os.Symlink(dir, dstLink))
	assert.Contains(t, overlap(dstLink, data, ""), "--src and --dst must not contain each other")

	assert.Contains(t, overlap(safe, filepath.Join(link, "etcd"), ""), "--data-dir "+filepath.Join(link, "etcd")+" is inside --src")
	for _, h := range []string{filepath.Join(src, "h.jsonl"), filepath.Join(link, "sub", "h.jsonl")} {
		assert.Contains(t, overlap(safe, data, h), "--history "+h+" is inside --src", "--history %s", h)
	}
}

// outputs reads every published output file of dst by name.
func outputs(t *testing.T, dst string) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dst, "*"+outputSuffix))
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out[filepath.Base(p)] = string(b)
	}
	return out
}

// touch changes a file's modification time, which gives its split a new
// identity in a new plan.
func touch(t *testing.T, path string) {
	t.Helper()
	later := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(path, later, later))
}

// A job rerun on a store that does not hold it (each mem:// is a store of
// its own) after a touch of one input file was a new plan over the first
// one's output: the touched file's split got a new identity and its lines
// were published a second time. The destination is bound to the plan that
// wrote it: the second run is refused (exit 2) naming both, and the output
// is untouched (0 duplicates). A destination an earlier version wrote (no
// binding, published files) is refused the same way.
func TestBackfillRerunOnAnotherStoreIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	lines := writeCorpus(t, src, 5, 400)
	args := []string{"backfill", "--src", src, "--dst", dst, "--store", "mem://", "--lease", "1s", "--split-bytes", "8192"}
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "first run", code, exitOK, out, errOut)
	before := outputs(t, dst)
	require.NotEmpty(t, before)

	touch(t, filepath.Join(src, "part-1", "f01.txt"))
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "rerun on another store", code, exitUsage, out, errOut)
	binding, err := os.ReadFile(filepath.Join(dst, ".spate", "plan"))
	require.NoError(t, err, "the destination's binding")
	for _, want := range []string{"--dst " + dst + " holds the output of job", "does not hold that plan", "it holds no record of job",
		"run with the store that holds plan", "give this run an empty --dst"} {
		assert.Contains(t, errOut, want)
	}
	var b destBinding
	require.NoError(t, json.Unmarshal(binding, &b))
	assert.Contains(t, errOut, "plan "+b.Plan, "the refusal names the destination's plan")
	assert.Equal(t, before, outputs(t, dst), "the refused run changed the output")
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "verify", "--src", src, "--dst", dst)
	expectCode(t, "verify", code, exitOK, out, errOut)
	assert.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines")

	// An earlier version's destination: a job marker and published files,
	// no binding.
	require.NoError(t, os.Remove(filepath.Join(dst, ".spate", "plan")))
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "rerun over an unbound destination", code, exitUsage, out, errOut)
	assert.Contains(t, errOut, "no binding ("+filepath.Join(dst, ".spate", "plan")+") ties it to a plan")
	assert.Contains(t, errOut, "give this run an empty --dst")
	assert.Equal(t, before, outputs(t, dst), "the refused run changed the output")

	// An empty --dst is the fix: the new plan copies everything once.
	dst2 := filepath.Join(dir, "dst2")
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, "backfill", "--src", src, "--dst", dst2, "--store", "mem://", "--lease", "1s", "--split-bytes", "8192")
	expectCode(t, "a new plan into an empty --dst", code, exitOK, out, errOut)
	assert.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines")
}

// Reruns on the store that holds the job keep working: a finished job
// rerun (after a touch) says it is complete, and writes nothing.
func TestBackfillRerunOnTheSameStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	writeCorpus(t, src, 5, 400)
	store := "redis://" + redisservers.Start(t).Addr()
	args := []string{"backfill", "--src", src, "--dst", dst, "--store", store, "--lease", "1s", "--split-bytes", "8192"}
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "first run", code, exitOK, out, errOut)
	before := outputs(t, dst)
	touch(t, filepath.Join(src, "part-1", "f01.txt"))
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "rerun on the same store", code, exitOK, out, errOut)
	assert.Contains(t, out, "is already complete")
	// Said on stderr in one line, with the command that starts it anew.
	var said string
	for _, l := range strings.Split(errOut, "\n") {
		if strings.Contains(l, "was already complete on this store; nothing was copied") {
			said = l
		}
	}
	require.NotEmpty(t, said, "not said on stderr:\n%s", errOut)
	assert.Contains(t, said, "To copy again from the start: spate delete --store "+store+" --job ")
	assert.Equal(t, before, outputs(t, dst))
}

// A worker whose --dst differs from the job's joined it and quarantined
// what it took over (the committed output was under the other --dst). It
// is refused at start, naming the job's and its own --dst, and creates
// nothing. A --dst at the job's path that holds none of its committed
// output (another host's disk, or a destination moved away) is refused
// too.
func TestBackfillWorkerWithAnotherDstIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst, other := filepath.Join(dir, "src"), filepath.Join(dir, "dst"), filepath.Join(dir, "other")
	writeCorpus(t, src, 5, 400)
	store := "redis://" + redisservers.Start(t).Addr()
	args := func(dst string) []string {
		return []string{"backfill", "--src", src, "--dst", dst, "--store", store, "--lease", "1s", "--split-bytes", "8192"}
	}
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, args(dst)...)
	expectCode(t, "first run", code, exitOK, out, errOut)

	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args(other)...)
	expectCode(t, "a worker with another --dst", code, exitUsage, out, errOut)
	assert.Contains(t, errOut, "this worker's flags differ from those of job")
	assert.Regexp(t, `--dst +the job's `+regexp.QuoteMeta(dst)+`, this worker's `+regexp.QuoteMeta(other), errOut)
	assert.NoDirExists(t, other, "the refused worker created its --dst")

	require.NoError(t, os.Rename(dst, filepath.Join(dir, "moved")))
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args(dst)...)
	expectCode(t, "a --dst without the job's output", code, exitUsage, out, errOut)
	assert.Contains(t, errOut, "has committed output under its --dst "+dst+", but "+dst+" holds none of it")
	assert.Contains(t, errOut, "spate delete --store "+store)
}

// The flags compared at start: each difference names the flag and both
// values; split options do not matter to a followed job.
func TestPlanParamsDifferences(t *testing.T) {
	f := backfillFlags{splitBytes: 100, splitFiles: 4}
	job := f.params("/src", "/dst")
	assert.Empty(t, job.differences(f.params("/src", "/dst")))
	g := backfillFlags{splitBytes: 200, splitFiles: 5}
	d := job.differences(g.params("/src2", "/dst"))
	require.Len(t, d, 3)
	assert.Contains(t, d[0], "--src")
	assert.Contains(t, d[0], "the job's /src, this worker's /src2")
	assert.Contains(t, d[1], "--split-bytes")
	assert.Contains(t, d[1], "the job's 100, this worker's 200")
	assert.Contains(t, d[2], "the job's 4, this worker's 5")
	// A followed job is resumed with --until-idle to wind it down; split
	// options do not shape it.
	fj := backfillFlags{follow: true, splitBytes: 1}
	fw := backfillFlags{follow: true, splitBytes: 2, untilIdle: time.Minute}
	assert.Empty(t, fj.params("/s", "/d").differences(fw.params("/s", "/d")))
	assert.Contains(t, fj.params("/s", "/d").differences(job)[0], "--src")
}

// A stall summary lists every quarantined split of the job with a reason:
// this worker's own with their files, the others' with the reason the store
// recorded (it listed them with none).
func TestExplainStalledGivesEveryQuarantinedSplitAReason(t *testing.T) {
	var out bytes.Buffer
	con := &console{out: &out, errOut: &out, start: time.Now(), width: func() int { return 0 }}
	f := backfillFlags{}
	f.store.url = "redis://127.0.0.1:6379"
	s := jobSummary{quarantinedIDs: []string{"f1aaa", "f1bbb", "f1ccc"},
		quarantinedWhy: map[string]string{"f1aaa": "mine: why", "f1bbb": "output: /dst/f1bbb.out is gone"}}
	f.explainStalled(con, "j", s, []string{"f1aaa [a.txt]: output: /dst/f1aaa.out holds 3 bytes"})
	got := out.String()
	assert.Contains(t, got, "  f1aaa [a.txt]: output: /dst/f1aaa.out holds 3 bytes\n")
	assert.Contains(t, got, "  f1bbb: output: /dst/f1bbb.out is gone\n")
	assert.Contains(t, got, "  f1ccc: (the store holds no reason; spate inspect shows the split)\n")
	assert.Contains(t, got, "spate requeue SPLIT --store redis://127.0.0.1:6379 --job j")
}

// A bucket --dst is bound the same way: its .spate/plan object, and a
// rerun on another store is refused.
func TestBackfillBucketDstIsBound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, out := filepath.Join(dir, "src"), filepath.Join(dir, "bucket")
	writeCorpus(t, src, 3, 200)
	require.NoError(t, os.MkdirAll(out, 0o755))
	dst := "file://" + filepath.ToSlash(out) + "?metadata=skip"
	args := []string{"backfill", "--src", src, "--dst", dst, "--store", "mem://", "--lease", "1s", "--split-bytes", "8192"}
	code, stdout, errOut := runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "first run", code, exitOK, stdout, errOut)
	assert.FileExists(t, filepath.Join(out, ".spate", "plan"))
	touch(t, filepath.Join(src, "part-1", "f01.txt"))
	code, stdout, errOut = runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "rerun on another store", code, exitUsage, stdout, errOut)
	assert.Contains(t, errOut, "does not hold that plan")
}

// Two first workers of one job start together: whatever the other records
// between this worker's reads of the destination's binding and of the
// job's parameters, both run on the one plan (a fresh job's second worker
// was once refused: it saw no parameters, then the first one's binding).
func TestFirstWorkersStartingTogetherShareThePlan(t *testing.T) {
	ctx := context.Background()
	st, err := mem.New(mem.Options{TTL: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	dst := t.TempDir()
	f := backfillFlags{splitBytes: 100, splitFiles: 4}
	mine := f.params("/src", dst)
	open := func() *destination {
		out, err := openOutput(ctx, dst)
		require.NoError(t, err)
		return out
	}
	var first planParams
	var firstErr error
	bindJobBetweenReads = func() {
		bindJobBetweenReads = nil
		first, firstErr = f.bindJob(ctx, st, open(), "mem://", "j", jobSummary{}, mine)
	}
	t.Cleanup(func() { bindJobBetweenReads = nil })
	second, err := f.bindJob(ctx, st, open(), "mem://", "j", jobSummary{}, mine)
	require.NoError(t, firstErr)
	require.NoError(t, err, "the second first worker is refused")
	require.NotEmpty(t, first.Plan)
	assert.Equal(t, first.Plan, second.Plan)
	b, bound, err := open().readBinding(ctx)
	require.NoError(t, err)
	require.True(t, bound)
	assert.Equal(t, first.Plan, b.Plan)
}
