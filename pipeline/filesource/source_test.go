package filesource_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
)

// Every resume point a commit can produce resumes exactly after the last
// committed line: nothing committed is re-emitted, nothing uncommitted is
// skipped.
func TestLaneResumesAfterTheLastCommittedLine(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"a": "one\ntwo\n", "b": "", "c": "three\n\nfour", "d": "five\n"}
	lines := corpus(t, dir, files)
	members, _ := filesource.ListFiles(context.Background(), dir)
	spec, _ := filesource.SplitFor(members)
	src := filesource.NewSource(filesource.Dir(dir))
	cp := pipeline.NewCheckpointer(nil)
	all := readUntilDone(t, src, spec.ID, openLane(t, src, spec, nil, cp, nil), 2)
	require.Len(t, all, len(lines), "read %d lines, want %d", len(all), len(lines))
	for i, p := range all {
		require.Equal(t, lines[string(p.Key)], string(p.Value), "line %q = %q, want %q", p.Key, p.Value, lines[string(p.Key)])
		if i > 0 {
			require.Greater(t, p.Offset, all[i-1].Offset, "offsets must increase")
		}
	}
	total := int64(len("one\ntwo\n" + "three\n\nfour" + "five\n"))
	require.Equal(t, total, all[len(all)-1].Offset+1, "last watermark %d, want the split size %d", all[len(all)-1].Offset+1, total)
	for i := range all {
		w := all[i].Offset + 1 // a watermark a commit can carry
		p := spate.NewSplitProgress(w, nil)
		require.NoError(t, src.ValidateResume(spec, p), "resume at %d rejected", w)
		src.CloseSplit(spec.ID)
		rest := readUntilDone(t, src, spec.ID, openLane(t, src, spec, &p, cp, nil), 3)
		require.True(t, slices.EqualFunc(rest, all[i+1:], func(a, b pipeline.RawPayload) bool { return string(a.Key) == string(b.Key) }),
			"resume at %d read %d lines, want the %d after it", w, len(rest), len(all)-i-1)
	}
	require.Error(t, src.ValidateResume(spec, spate.NewSplitProgress(2, nil)), "a watermark inside a line must be rejected")
}

func TestMissingFileIsPoison(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a": "x\n", "b": "y\n"})
	members, _ := filesource.ListFiles(context.Background(), dir)
	spec, _ := filesource.SplitFor(members)
	os.Remove(filepath.Join(dir, "b"))
	src := filesource.NewSource(filesource.Dir(dir))
	var reasons []string
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
	got := readUntilDone(t, src, spec.ID, l, 10)
	require.Len(t, got, 1, "lines %d reasons %v", len(got), reasons)
	require.Len(t, reasons, 1, "lines %d reasons %v", len(got), reasons)
	require.Contains(t, reasons[0], "b", "lines %d reasons %v", len(got), reasons)
	require.False(t, src.Unfinished(spec.ID), "a poisoned lane has nothing left to read")
}

// A whole backfill over one instance: every input line reaches the file
// sink, every split completes, and the run ends Completed on its own.
func TestBackfillDeliversEveryLine(t *testing.T) {
	in, outDir := t.TempDir(), t.TempDir()
	lines := corpus(t, in, genCorpus(t, in, 40, 60, 1))
	coord := &localCoord{durable: &localStore{progress: map[spate.SplitID]spate.SplitProgress{}}}
	src := filesource.New(filesource.Dir(in), coord, filesource.PlannerOptions{TargetBytes: 4 << 10, MaxFiles: 4})
	sink, _ := filesink.NewFileSink(outDir, "out")
	defer sink.Close()
	rt, err := pipeline.Build(testConfig(), src, nil, []pipeline.SinkSpec{{Name: "file", Sink: sink, Options: sinkOpts()}})
	require.NoError(t, err)
	r, err := rt.Run(t.Context())
	require.NoError(t, err, "report %+v", r)
	require.Equal(t, pipeline.Completed, r.State, "report %+v err %v", r, err)
	require.Zero(t, r.UnresolvedAcks, "report %+v err %v", r, err)
	seen := outputLines(t, sink, 2)
	for key := range lines {
		require.NotZero(t, seen[key], "line %s never reached the output", key)
	}
	require.Len(t, seen, len(lines), "output has %d distinct lines, input %d", len(seen), len(lines))
	for key, n := range seen {
		require.Equal(t, 1, n, "line %s written %d times in a clean single run", key, n)
	}
}

// A stopped run resumes: the second run never re-emits a committed line,
// and together the runs deliver every line.
func TestBackfillResumesAfterAStop(t *testing.T) {
	in, outDir := t.TempDir(), t.TempDir()
	lines := corpus(t, in, genCorpus(t, in, 30, 200, 2))
	store := &localStore{progress: map[spate.SplitID]spate.SplitProgress{}}
	sink, _ := filesink.NewFileSink(outDir, "out")
	defer sink.Close()
	cfg := testConfig()
	cfg.MaxRecords = 8
	cfg.DrainTimeout = 500 * time.Millisecond
	cfg.StopReserve = 400 * time.Millisecond

	// Run 1: stop after some output. Its sink lands at most half the lines
	// and then holds every write until the stop's drain deadline ends it,
	// so run 1 cannot finish the job before the stop, however fast it reads.
	c1 := &localCoord{durable: store}
	gated := &gatedSink{inner: sink, left: len(lines) / 2}
	rt1, _ := pipeline.Build(cfg, filesource.New(filesource.Dir(in), c1, filesource.PlannerOptions{TargetBytes: 8 << 10, MaxFiles: 4}), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: gated, Options: sinkOpts()}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan pipeline.ExitReport, 1)
	go func() { r, _ := rt1.Run(ctx); done <- r }()
	deadline := time.Now().Add(10 * time.Second)
	for len(outputLines(t, sink, 2)) < len(lines)/4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	r1 := <-done
	require.Equal(t, pipeline.Stopped, r1.State, "run 1: %+v", r1)
	require.Zero(t, r1.UnresolvedAcks, "run 1: %+v", r1)
	store.mu.Lock()
	committed := map[spate.SplitID]spate.SplitProgress{}
	for k, v := range store.progress {
		committed[k] = v
	}
	specs := store.specs
	store.mu.Unlock()
	firstRun := outputLines(t, sink, 2)
	require.Less(t, len(firstRun), len(lines), "run 1 wrote everything before the stop; nothing is left to resume")

	// Run 2 resumes from the committed progress.
	c2 := &localCoord{durable: store}
	rt2, _ := pipeline.Build(cfg, filesource.New(filesource.Dir(in), c2, filesource.PlannerOptions{TargetBytes: 8 << 10, MaxFiles: 4}), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: sinkOpts()}})
	r2, err := rt2.Run(t.Context())
	require.NoError(t, err, "run 2: %+v", r2)
	require.Equal(t, pipeline.Completed, r2.State, "run 2: %+v %v", r2, err)
	require.Zero(t, r2.UnresolvedAcks, "run 2: %+v %v", r2, err)
	both := outputLines(t, sink, 2)
	for key := range lines {
		require.NotZero(t, both[key], "line %s never reached the output", key)
	}
	// A line covered by run 1's committed watermark is never written again.
	for _, spec := range specs {
		p, ok := committed[spec.ID]
		if !ok {
			continue
		}
		d, _ := filesource.DecodeDescriptor(spec.Descriptor)
		var base int64
		for _, f := range d.Files {
			for key := range lines {
				name, off, _ := strings.Cut(key, ":")
				if name != f.Name {
					continue
				}
				o, _ := strconv.ParseInt(off, 10, 64)
				end := base + o + int64(len(lines[key]))
				if end < p.Watermark {
					require.Equal(t, firstRun[key], both[key], "committed line %s re-emitted by the resumed run", key)
				}
			}
			base += f.Size
		}
	}
}

// gatedSink lets left records land in inner, then holds every write until
// its context ends (the stop's drain deadline).
type gatedSink struct {
	inner pipeline.Sink
	mu    sync.Mutex
	left  int
}

func (g *gatedSink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	g.mu.Lock()
	pass := g.left >= len(records)
	if pass {
		g.left -= len(records)
	}
	g.mu.Unlock()
	if !pass {
		<-ctx.Done()
		return ctx.Err()
	}
	return g.inner.Write(ctx, shard, records)
}
