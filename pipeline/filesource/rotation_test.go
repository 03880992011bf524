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

// A followed file that has gone idle parks: its split stays (it is not
// completed) but its commits say it takes no lane. One renamed away is
// read to its end first (its last line without a newline too), since its
// writer has moved on. A file that grows again takes its lane back and is
// read on from where it stopped; a deleted one completes.
func TestTailLaneParksAnIdleFile(t *testing.T) {
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
	acked := int64(0)
	// swept is what the coordination driver's sweep is handed: a completion, or a
	// change of the park state since the last commit.
	swept := func() *spate.SplitProgress {
		p, err := src.Sweep(spec.ID)
		require.NoError(t, err)
		return p
	}
	parked := func([]string) bool {
		p := swept()
		return p != nil && p.Parked
	}
	commitAll := func(n int) spate.SplitProgress {
		acked = int64(n)
		p, err := src.EncodeCommit(spec.ID, acked)
		require.NoError(t, err)
		return p
	}
	path := filepath.Join(dir, "app.log")
	past := time.Now().Add(-time.Hour)

	lines := pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 2 })
	require.Equal(t, []string{"a1", "a2"}, lines)
	require.False(t, commitAll(6).Parked, "a file written a moment ago parked")
	pollTail(t, l, 20, parked)
	require.Nil(t, swept(), "a live file's split changed its park state")

	// Idle at its name: parked, not completed, nothing flushed.
	require.NoError(t, os.Chtimes(path, past, past))
	var p *spate.SplitProgress
	pollTail(t, l, 500, func([]string) bool { p = swept(); return p != nil })
	require.NotNil(t, p, "an idle file did not park")
	require.True(t, p.Parked)
	require.False(t, p.Completed)
	require.Equal(t, int64(6), p.Watermark)
	require.Nil(t, swept(), "the park state is handed to the coordination driver once")
	assert.Equal(t, 1, logs.count("parked an idle followed file", "app.log"))

	// Renamed away, written a moment ago: it takes its lane back.
	require.NoError(t, os.Rename(path, path+".1"))
	f, err := os.OpenFile(path+".1", os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("a3\nlast without newline")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	lines = pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	require.Equal(t, []string{"a3"}, lines)
	require.False(t, commitAll(9).Parked, "a file that grew stayed parked")
	pollTail(t, l, 20, parked)
	require.Nil(t, swept(), "a renamed file written a moment ago parked")

	// Idle past ReleaseAfter: read to its end (its last line without a
	// newline too) and parked.
	require.NoError(t, os.Chtimes(path+".1", past, past))
	lines = pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	require.Equal(t, []string{"last without newline"}, lines)
	end := 9 + len("last without newline")
	p = nil
	for range 500 {
		if c := commitAll(end); c.Parked {
			p = &c
			break
		}
		pollTail(t, l, 1, func([]string) bool { return false })
	}
	require.NotNil(t, p, "the renamed idle file still holds its lane")
	require.False(t, p.Completed, "the renamed idle file's split completed: it could not resume")
	assert.Equal(t, 1, logs.count("parked a followed file that was renamed away", "app.log.1"))
	assert.Equal(t, 1, logs.count("was renamed", "app.log"))

	// It grows again: read on from where it stopped, its lane taken back.
	f, err = os.OpenFile(path+".1", os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("a4\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	lines = pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
	require.Equal(t, []string{"a4"}, lines)
	require.False(t, commitAll(end+3).Parked)
	// Twice under its new name: the parked file's descriptor was closed,
	// so its first growth after the rename was found under app.log.1.
	assert.Equal(t, 2, logs.count("a parked followed file grew", "app.log.1"))

	// Deleted: its split completes.
	require.NoError(t, os.Remove(path+".1"))
	pollTail(t, l, 500, func([]string) bool { p = swept(); return p != nil && p.Completed })
	require.NotNil(t, p)
	require.True(t, p.Completed, "a deleted file's split did not complete")
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
