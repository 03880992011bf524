package filesource_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// gzipped is text compressed, as logrotate's compress leaves it.
func gzipped(t *testing.T, text string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(text))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.String()
}

// logLines keeps the records a logger wrote, with their level.
type logLines struct{ recorded }

func (l *logLines) logger() *slog.Logger { return slog.New(l) }

// followPlan is the names of the files a following plan of dir plans.
func followPlan(t *testing.T, dir string, opts filesource.PlannerOptions) (map[string]spate.SplitSpec, error) {
	t.Helper()
	opts.Follow = true
	plan, err := filesource.NewPlanner(filesource.Dir(dir), opts).Plan(context.Background(), spate.PlanContext{})
	if err != nil {
		return nil, err
	}
	out := map[string]spate.SplitSpec{}
	for _, s := range plan.Splits {
		d, err := filesource.DecodeDescriptor(s.Spec.Descriptor)
		require.NoError(t, err)
		require.NotNil(t, d.Tail)
		out[d.Tail.Name] = s.Spec
	}
	return out, nil
}

func names(m map[string]spate.SplitSpec) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}

// What logrotate leaves beside a live log is not followed by default: the
// copy copytruncate makes (app.log.1), a dated copy (dateext), compressed
// archives. A file whose bytes are not text (a compressed file under a log
// name, NUL bytes) is refused with one warning naming it, however often
// it is listed. --include/--exclude override the defaults, and a bad
// pattern is an error naming it.
func TestFollowLeavesRotatedCompressedAndBinaryFilesOut(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{
		"app.log":               "live 1\nlive 2\n",
		"app.log.1":             "copied 1\n",
		"app.log.12":            "older copy\n",
		"app.log-20261207":      "dated copy\n",
		"app.log.2.gz":          gzipped(t, "archived 1\n"),
		"old/app.log.3.bz2":     "BZh91AY&SY",
		"sub/web.log":           "web 1\n",
		"packed.log":            gzipped(t, "not a log\n"),
		"holes.log":             "\x00\x00\x00\x00line after a hole\n",
		"empty.log":             "",
		"notes.txt":             "a note\n",
		"dump.zst":              "\x28\xb5\x2f\xfd...",
		"archive/2026-12.zip":   "PK\x03\x04...",
		"app.log-20261207.xz":   "\xfd7zXZ\x00...",
		"keep.log.1.lz4":        "\x04\x22\x4d\x18",
		"weird-name-2026.log.1": "renamed by hand\n",
	})
	var logs logLines
	opts := filesource.PlannerOptions{Logger: logs.logger()}
	got, err := followPlan(t, dir, opts)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"app.log", "sub/web.log", "empty.log", "notes.txt"}, names(got),
		"by default only files that are not a rotation's copy, an archive or binary are followed")

	// The same planner listing again warns no more.
	p := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true, Logger: logs.logger()})
	for range 3 {
		_, err := p.Plan(context.Background(), spate.PlanContext{})
		require.NoError(t, err)
	}
	require.Equal(t, 2, logs.count("refused to follow a file that is not text", "packed.log"), "packed.log: one warning per planner")
	require.Equal(t, 2, logs.count("refused to follow a file that is not text", "holes.log"), "holes.log: one warning per planner")
	require.Equal(t, 4, logs.count("refused to follow", ""), "no other file is refused: the rest are left out by name")

	// Overrides: --include narrows; a given --exclude replaces the
	// defaults; NoDefaultExcludes follows every text file.
	quiet := slog.New(slog.DiscardHandler)
	got, err = followPlan(t, dir, filesource.PlannerOptions{Include: []string{"*.log"}, Logger: quiet})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"app.log", "sub/web.log", "empty.log"}, names(got))
	got, err = followPlan(t, dir, filesource.PlannerOptions{Include: []string{"sub/*.log"}, Logger: quiet})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"sub/web.log"}, names(got), "a pattern with a slash matches the relative path")
	got, err = followPlan(t, dir, filesource.PlannerOptions{Exclude: []string{"*.txt", "*.gz"}, Logger: quiet})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"app.log", "app.log.1", "app.log.12", "app.log-20261207", "sub/web.log", "empty.log", "weird-name-2026.log.1"}, names(got))
	got, err = followPlan(t, dir, filesource.PlannerOptions{NoDefaultExcludes: true, Include: []string{"app.log*"}, Logger: quiet})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"app.log", "app.log.1", "app.log.12", "app.log-20261207"}, names(got),
		"compressed app.log archives are still refused by their bytes")

	_, err = followPlan(t, dir, filesource.PlannerOptions{Include: []string{"[a-"}})
	require.ErrorContains(t, err, `pattern "[a-"`)
	require.Error(t, filesource.ValidatePatterns([]string{"/abs/*.log"}))

	// A bounded (not following) job takes the patterns too, but no default.
	plan, err := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Include: []string{"app.log*"}, Exclude: []string{"*.gz", "*.xz", "*.bz2"}}).
		Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Len(t, plan.Splits, 1)
	d, err := filesource.DecodeDescriptor(plan.Splits[0].Spec.Descriptor)
	require.NoError(t, err)
	var members []string
	for _, m := range d.Files {
		members = append(members, m.Name)
	}
	assert.Equal(t, []string{"app.log", "app.log-20261207", "app.log.1", "app.log.12"}, members)
}

func (r *recorded) count(msg, file string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i, m := range r.msgs {
		if strings.Contains(m, msg) && (file == "" || r.files[i] == file) {
			n++
		}
	}
	return n
}

// pollTail polls a tail lane until cond holds of the lines read so far
// (copies), or the lane ended; at most polls times.
func pollTail(t *testing.T, l pipeline.Lane, polls int, cond func([]string) bool) []string {
	t.Helper()
	var lines []string
	for range polls {
		b, err := l.Poll(100, 20*time.Millisecond)
		require.NoError(t, err)
		if b != nil {
			for _, p := range b.Payloads {
				lines = append(lines, string(p.Value))
			}
			b.Ack.Release()
		}
		if cond(lines) {
			return lines
		}
	}
	return lines
}

// A file whose first bytes turn out not to be text once it has some (it
// was empty when planned) is refused by its lane: one warning names it, no
// line of it is shipped, and its split completes.
func TestTailLaneRefusesAFileThatIsNotText(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"app.log": ""})
	var logs logLines
	planner := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true, Logger: logs.logger()})
	plan, err := planner.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Len(t, plan.Splits, 1)
	spec := plan.Splits[0].Spec
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app.log"), []byte(gzipped(t, strings.Repeat("line\n", 1000))), 0o644))

	src := filesource.NewSource(filesource.Dir(dir)).WithLogger(logs.logger()).WithPlanner(planner)
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil)
	var done *spate.SplitProgress
	lines := pollTail(t, l, 500, func([]string) bool {
		done, err = src.Sweep(spec.ID)
		require.NoError(t, err)
		return done != nil
	})
	assert.Empty(t, lines, "gzip bytes shipped as lines")
	require.NotNil(t, done, "the refused file's split did not complete")
	assert.True(t, done.Completed)
	assert.Equal(t, 1, logs.count("refused to follow a file that is not text", "app.log"))
}

// A followed file that was renamed away and has gone idle is read to its
// end and released: its split completes, freeing its lane. One that is
// still at its name is followed however long it is idle, and so is a
// renamed one that is still being written.
func TestTailLaneReleasesARenamedIdleFile(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"app.log": "a1\na2\n"})
	var logs logLines
	planner := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true, Logger: logs.logger(), ReleaseAfter: time.Minute})
	plan, err := planner.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Len(t, plan.Splits, 1)
	spec := plan.Splits[0].Spec
	src := filesource.NewSource(filesource.Dir(dir)).WithLogger(logs.logger()).WithPlanner(planner)
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil)
	defer src.CloseSplit(spec.ID)
	completed := func([]string) bool {
		p, err := src.Sweep(spec.ID)
		require.NoError(t, err)
		return p != nil && p.Completed
	}
	commitAll := func(n int) {
		_, err := src.EncodeCommit(spec.ID, int64(n))
		require.NoError(t, err)
	}
	path := filepath.Join(dir, "app.log")
	past := time.Now().Add(-time.Hour)

	lines := pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 2 })
	require.Equal(t, []string{"a1", "a2"}, lines)
	commitAll(6)
	// Idle at its name: followed on (many end-of-file checks).
	require.NoError(t, os.Chtimes(path, past, past))
	pollTail(t, l, 20, completed)
	require.False(t, completed(nil), "a file idle at its own name was released")

	// Renamed away, written on a moment: still followed.
	require.NoError(t, os.Rename(path, path+".1"))
	f, err := os.OpenFile(path+".1", os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("a3\nlast without newline")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	lines = pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	require.Equal(t, []string{"a3"}, lines)
	commitAll(9)
	pollTail(t, l, 20, completed)
	require.False(t, completed(nil), "a renamed file written a moment ago was released")

	// Idle past ReleaseAfter: read to its end (its last line without a
	// newline too) and released.
	require.NoError(t, os.Chtimes(path+".1", past, past))
	lines = pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	require.Equal(t, []string{"last without newline"}, lines)
	commitAll(9 + len("last without newline"))
	pollTail(t, l, 500, completed)
	require.True(t, completed(nil), "the renamed idle file still holds its lane")
	assert.Equal(t, 1, logs.count("released a followed file", "app.log.1"))
	assert.Equal(t, 1, logs.count("was renamed", "app.log"))
}

// waitAsk waits for the planner to ask for a listing: a bound long past
// any event delivery, not a timing.
func waitAsk(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("the planner did not ask for a listing after %s", what)
	}
}

// drainAsks empties the channel of asks already made.
func drainAsks(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		case <-time.After(500 * time.Millisecond):
			return
		}
	}
}

// A following planner asks the leader for a listing when a file appears
// in the followed tree (a new subdirectory's files too) and when a lane
// of its process sees its file moved away, not at the next replan; its
// watch ends with the context.
func TestFollowPlannerAsksForAListingWhenAFileAppears(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"app.log": "a1\n"})
	planner := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	asks := planner.PlanTriggers(ctx)
	drainAsks(asks)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "new.log"), []byte("n1\n"), 0o644))
	waitAsk(t, asks, "a file was created")
	drainAsks(asks)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	waitAsk(t, asks, "a directory was created")
	drainAsks(asks)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "deep.log"), []byte("d1\n"), 0o644))
	waitAsk(t, asks, "a file was created in a new directory")
	drainAsks(asks)

	// A lane that sees its file moved out of the input asks (the watch
	// sees no file appear).
	plan, err := planner.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	var spec spate.SplitSpec
	for _, s := range plan.Splits {
		d, err := filesource.DecodeDescriptor(s.Spec.Descriptor)
		require.NoError(t, err)
		if d.Tail.Name == "app.log" {
			spec = s.Spec
		}
	}
	src := filesource.NewSource(filesource.Dir(dir)).WithLogger(slog.New(slog.DiscardHandler)).WithPlanner(planner)
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil)
	defer src.CloseSplit(spec.ID)
	pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	drainAsks(asks)
	require.NoError(t, os.Rename(filepath.Join(dir, "app.log"), filepath.Join(t.TempDir(), "away.log")))
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollTail(t, l, 200, func([]string) bool { return false })
	}()
	waitAsk(t, asks, "a lane saw its file moved away")
	<-done
}
