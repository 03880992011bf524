package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A published output file truncated under a job whose worker was killed:
// the next run sets that split aside (quarantined with the reason naming
// the file and the fix), finishes every other split, and exits 3 with the
// reason in its summary; the truncated file is left as it was.
func TestBackfillSetsADamagedOutputAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	writeCorpus(t, src, 6, 8000) // ~360 KiB of output per split: far from done at the third publish
	args := []string{"backfill", "--src", src, "--dst", dst, "--job", "damage", "--lease", "2s",
		// One file a split, not divided into ranges: a split is long under way.
		"--split-bytes", "1048576", "--split-files", "1", "--min-splits", "1",
		// Published at every commit, so the file grows under way.
		"--publish", "commit",
		"--commit-interval", "200ms", "--data-dir", filepath.Join(dir, "etcd")}
	p := start(t, dir, "", append(args, "--rate", "600")...) // each split takes ~15 s
	// Wait for a split under way whose published file grew three times:
	// at least two commits published, so the first size seen is inside
	// the prefix the last commit lists as already published. (Damage to
	// the last commit's own range heals: that range is published again
	// from the staging file.)
	var victim string
	var firstSize int64
	sizes := map[string][]int64{}
	deadline := time.Now().Add(60 * time.Second)
	completed := regexp.MustCompile(`completed (\S+)`)
	for victim == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		done := map[string]bool{}
		for _, m := range completed.FindAllStringSubmatch(p.stdout.String(), -1) {
			done[m[1]] = true
		}
		outs, _ := filepath.Glob(filepath.Join(dst, "*.out"))
		for _, o := range outs {
			st, err := os.Stat(o)
			if err != nil || st.Size() == 0 || done[strings.TrimSuffix(filepath.Base(o), ".out")] {
				continue
			}
			if seen := sizes[o]; len(seen) == 0 || seen[len(seen)-1] != st.Size() {
				sizes[o] = append(seen, st.Size())
			}
			if len(sizes[o]) >= 3 {
				victim, firstSize = o, sizes[o][0]
				break
			}
		}
	}
	require.NotEmpty(t, victim, "no split under way published three times:\n%s", p.stdout.String())
	require.NoError(t, p.cmd.Process.Kill())
	<-p.done
	cut := firstSize / 2
	require.NoError(t, os.Truncate(victim, cut))

	t.Logf("truncated %s from %v to %d bytes", victim, sizes[victim], cut)
	code, out, errOut := runSpate(t, dir, "", 3*time.Minute, args...)
	expectCode(t, "the run over a damaged output", code, 3, out, errOut)
	i := strings.Index(out, "the job cannot finish")
	require.GreaterOrEqual(t, i, 0, "no stalled summary:\n%s", out)
	summary := out[i:]
	t.Logf("summary: %s", summary)
	require.Contains(t, summary, victim+" holds", "the summary names the damaged file")
	require.Contains(t, summary, "truncated", "the summary says what happened to it")
	require.Contains(t, summary, "spate requeue", "the summary names the command to run after the fix")
	after, err := os.Stat(victim)
	require.NoError(t, err)
	require.Equal(t, cut, after.Size(), "the damaged file was written to")
}
