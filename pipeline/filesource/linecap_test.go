package filesource_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// capCase is a file with one line over (or at) a line cap.
type capCase struct {
	name    string
	cap     int
	content string
	// lines is how many lines are delivered before the lane stops; off is
	// the offset of the line over the cap (-1: none is).
	lines int
	off   int
}

func capCases() []capCase {
	head := "first\nsecond\n"
	off := len(head)
	return []capCase{
		{"over the cap, in the first read", 1000, head + strings.Repeat("L", 1001) + "\nafter\n", 2, off},
		{"over the cap, longer than the read buffer", 600 << 10, head + strings.Repeat("L", 700<<10) + "\nafter\n", 2, off},
		{"over the cap, with no newline, at the end", 1000, head + strings.Repeat("L", 1001), 2, off},
		{"over the cap, with no newline, longer than the buffer", 300 << 10, head + strings.Repeat("L", 3<<20), 2, off},
		{"at the cap", 1000, head + strings.Repeat("L", 1000) + "\nafter\n", 4, -1},
		{"at the cap, longer than the read buffer", 600 << 10, head + strings.Repeat("L", 600<<10) + "\nafter\n", 4, -1},
		{"at the cap, with no newline, at the end", 1000, head + strings.Repeat("L", 1000), 3, -1},
	}
}

// checkCapRun checks what a lane delivered and reported for c.
func checkCapRun(t *testing.T, c capCase, file string, got []pipeline.RawPayload, reasons []string) {
	t.Helper()
	require.Len(t, got, c.lines, "lines delivered (reasons %v)", reasons)
	require.Equal(t, "first", string(got[0].Value))
	require.Equal(t, "second", string(got[1].Value))
	if c.off < 0 {
		require.Empty(t, reasons, "a line at the cap is read")
		require.Len(t, got[2].Value, c.cap)
		return
	}
	require.Len(t, reasons, 1, "the split fails once")
	require.Contains(t, reasons[0], file+": the line at byte offset "+strconv.Itoa(c.off)+
		" is longer than the line cap of "+strconv.Itoa(c.cap)+" bytes")
	require.Contains(t, reasons[0], "--max-line-bytes", "the error says how to raise the cap")
}

// A line longer than the cap fails its split, with an error naming the
// file and the line's byte offset, after the lines before it; a line of
// exactly the cap is read. So a lane's memory is bounded by the cap.
func TestLineOverTheCapFailsItsSplit(t *testing.T) {
	for _, c := range capCases() {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			corpus(t, dir, map[string]string{"in/long.log": c.content})
			members, err := filesource.ListFiles(context.Background(), dir)
			require.NoError(t, err)
			spec, err := filesource.SplitFor(members)
			require.NoError(t, err)
			src := filesource.NewSource(filesource.Dir(dir)).WithMaxLineBytes(c.cap)
			var reasons []string
			l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
			got := readUntilDone(t, src, spec.ID, l, 3)
			checkCapRun(t, c, "in/long.log", got, reasons)
		})
	}
}

// A followed file's lane holds the same cap.
func TestFollowedLineOverTheCapFailsItsSplit(t *testing.T) {
	for _, c := range capCases() {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			corpus(t, dir, map[string]string{"long.log": c.content})
			plan, err := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true}).Plan(context.Background(), spate.PlanContext{})
			require.NoError(t, err)
			require.Len(t, plan.Splits, 1)
			spec := plan.Splits[0].Spec
			src := filesource.NewSource(filesource.Dir(dir)).WithMaxLineBytes(c.cap)
			src.PlanFinalized() // the lane ends at the end of the file
			var reasons []string
			l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
			var got []pipeline.RawPayload
			for polls := 0; len(reasons) == 0 && polls < 100000; polls++ {
				b, err := l.Poll(3, 0)
				require.NoError(t, err)
				if b == nil {
					if p, _ := src.Sweep(spec.ID); p != nil || len(got) == c.lines && c.off >= 0 {
						break
					}
					src.EncodeCommit(spec.ID, 0)
					continue
				}
				for _, p := range b.Payloads {
					got = append(got, pipeline.RawPayload{Key: []byte(string(p.Key)), Value: []byte(string(p.Value))})
				}
				src.EncodeCommit(spec.ID, b.Payloads[len(b.Payloads)-1].Offset+1)
				b.Ack.Release()
			}
			checkCapRun(t, c, "long.log", got, reasons)
		})
	}
}

// A job over a file with a line over the default cap (1 MiB): that split
// is quarantined with the error naming the file and offset, and every
// other split completes with its lines published exactly once.
func TestJobWithALineOverTheDefaultCapCompletesTheRest(t *testing.T) {
	in := t.TempDir()
	head := numbered("h", 10)
	lines := corpus(t, in, map[string]string{
		"a.log": numbered("a", 50), "huge.log": head + strings.Repeat("L", filesource.DefaultMaxLineBytes+1) + "\n" + numbered("t", 5),
		"z.log": numbered("z", 50),
	})
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	dst := t.TempDir()
	w := startStaged(t, "only", store, in, func() stagedSink {
		sink, err := filesink.NewStagedFileSink(dst, "out")
		require.NoError(t, err)
		return sink
	}, filesource.PlannerOptions{MaxFiles: 1})
	r := w.wait(t)
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r)
	require.ErrorContains(t, r.Failure, "stalled", "the job ends stalled on the quarantined split: %+v", r)
	snap, err := spate.InspectJob(context.Background(), store, "")
	require.NoError(t, err)
	quarantined := 0
	for _, s := range snap.Splits {
		if s.Status == spate.StatusQuarantined {
			quarantined++
			require.Contains(t, s.LastFailure, "huge.log: the line at byte offset "+strconv.Itoa(len(head))+" is longer than the line cap of 1048576 bytes")
			continue
		}
		require.Equal(t, spate.StatusCompleted, s.Status, "split %s", s.ID)
	}
	require.Equal(t, 1, quarantined)
	// The published output: the lines before the long one were read by
	// every attempt, and published at most once.
	seen := publishedLines(t, dst)
	for key := range lines {
		if strings.HasPrefix(key, "huge.log:") {
			require.LessOrEqual(t, seen[key], 1, "line %s", key)
			continue
		}
		require.Equal(t, 1, seen[key], "line %s", key)
	}
}

// BenchmarkLaneLineOverTheCap reads a split whose one line is 32 MiB: the
// lane's allocations (B/op) stay about twice the cap, however long the
// line, where an uncapped lane's grow with the line.
func BenchmarkLaneLineOverTheCap(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "long.log")
	require.NoError(b, os.WriteFile(p, []byte("first\n"+strings.Repeat("L", 32<<20)+"\n"), 0o644))
	members, err := filesource.ListFiles(context.Background(), dir)
	require.NoError(b, err)
	spec, err := filesource.SplitFor(members)
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		src := filesource.NewSource(filesource.Dir(dir))
		failed := false
		l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Issuer: pipeline.NewCheckpointer(nil).Issuer(),
			Waker: spate.InertWaker(), Poison: func(string) { failed = true }})
		require.NoError(b, err)
		for polls := 0; !failed && src.Unfinished(spec.ID); polls++ {
			require.Less(b, polls, 1000)
			batch, err := l.Poll(16, 0)
			require.NoError(b, err)
			if batch != nil {
				batch.Ack.Release()
			}
		}
		src.CloseSplit(spec.ID)
	}
}
