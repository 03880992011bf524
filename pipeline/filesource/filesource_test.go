package filesource_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// corpus writes files under dir and returns every line as "name:offset".
func corpus(t *testing.T, dir string, files map[string]string) map[string]string {
	t.Helper()
	lines := map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		off := 0
		for off < len(content) {
			end := strings.IndexByte(content[off:], '\n')
			next := len(content)
			if end >= 0 {
				next = off + end + 1
			}
			lines[name+":"+strconv.Itoa(off)] = strings.TrimSuffix(content[off:next], "\n")
			off = next
		}
	}
	return lines
}

func genCorpus(t *testing.T, dir string, nfiles, maxLines int, seed uint64) map[string]string {
	r := rand.New(rand.NewPCG(seed, seed))
	files := map[string]string{}
	for i := range nfiles {
		var b strings.Builder
		n := r.IntN(maxLines + 1)
		for j := range n {
			fmt.Fprintf(&b, "file %d line %d %s\n", i, j, strings.Repeat("x", r.IntN(40)))
		}
		content := b.String()
		if i%7 == 3 && len(content) > 0 {
			content = content[:len(content)-1] // no trailing newline
		}
		files[fmt.Sprintf("d%d/f%03d.txt", i%3, i)] = content
	}
	return files
}

func TestPlannerIsDeterministicAndPacksByBytes(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a": strings.Repeat("x\n", 50), "b": strings.Repeat("y\n", 50), "c": strings.Repeat("z\n", 200), "d": "", "e": "q\n"})
	p := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{TargetBytes: 250, MaxFiles: 2})
	plan, err := p.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Equal(t, spate.PlanFinal, plan.Finality, "a directory backfill plan is final")
	var groups [][]string
	for _, s := range plan.Splits {
		d, err := filesource.DecodeDescriptor(s.Spec.Descriptor)
		require.NoError(t, err)
		var names []string
		for _, f := range d.Files {
			names = append(names, f.Name)
		}
		groups = append(groups, names)
		require.Equal(t, uint64(max(d.Total(), 1)), s.Spec.Weight, "weight %d for %d bytes", s.Spec.Weight, d.Total())
		id := s.Spec.ID.String()
		require.LessOrEqual(t, len(id), spate.SplitIDMaxLen, "id %q", id)
		require.True(t, strings.HasPrefix(id, "f1"), "id %q", id)
	}
	want := [][]string{{"a", "b"}, {"c"}, {"d", "e"}}
	require.Equal(t, fmt.Sprint(want), fmt.Sprint(groups), "packing %v, want %v", groups, want)
	again, _ := p.Plan(context.Background(), spate.PlanContext{})
	for i := range plan.Splits {
		require.Equal(t, plan.Splits[i].Spec.ID, again.Splits[i].Spec.ID, "unchanged files must plan the same ids")
	}
	// An overwritten file is new work.
	later := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(dir, "c"), later, later))
	changed, _ := p.Plan(context.Background(), spate.PlanContext{})
	require.NotEqual(t, plan.Splits[1].Spec.ID, changed.Splits[1].Spec.ID, "only the changed file's split id may change")
	require.Equal(t, plan.Splits[0].Spec.ID, changed.Splits[0].Spec.ID, "only the changed file's split id may change")
}

// openLane opens a lane of spec on src; poison defaults to failing t.
func openLane(t *testing.T, src *filesource.Source, spec spate.SplitSpec, progress *spate.SplitProgress, cp *pipeline.Checkpointer, poison func(string)) pipeline.Lane {
	t.Helper()
	if poison == nil {
		poison = func(r string) { t.Errorf("poison: %s", r) }
	}
	l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Progress: progress, Issuer: cp.Issuer(), Waker: spate.InertWaker(), Poison: poison})
	require.NoError(t, err)
	return l
}

// readUntilDone polls until the lane has nothing left to read (a failed
// read returns an empty batch without ending the lane). It keeps copies of
// the payloads: a lane reuses their memory on its next poll.
func readUntilDone(t *testing.T, src *filesource.Source, id spate.SplitID, l pipeline.Lane, max int) []pipeline.RawPayload {
	t.Helper()
	var out []pipeline.RawPayload
	for range 100000 {
		b, err := l.Poll(max, 0)
		require.NoError(t, err)
		if b == nil {
			if !src.Unfinished(id) {
				return out
			}
			continue
		}
		for _, p := range b.Payloads {
			p.Key = bytes.Clone(p.Key)
			p.Value = bytes.Clone(p.Value)
			out = append(out, p)
		}
		b.Ack.Release()
	}
	require.Fail(t, "lane never ended")
	return nil
}

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

// localCoord is a single-instance coordinator in the shape of the seed's
// LocalCoordinator: it plans on Start, grants every split, and keeps
// progress in a store shared across runs, so a rerun resumes.
type localCoord struct {
	mu       sync.Mutex
	waker    spate.Waker
	durable  *localStore
	pending  []spate.Event
	held     map[spate.SplitID]bool
	finished bool
}

type localStore struct {
	mu       sync.Mutex
	specs    []spate.SplitSpec
	progress map[spate.SplitID]spate.SplitProgress
}

func (c *localCoord) SetWaker(w spate.Waker) { c.waker = w }

func (c *localCoord) Start(planner spate.SplitPlanner) error {
	c.durable.mu.Lock()
	defer c.durable.mu.Unlock()
	if c.durable.specs == nil {
		plan, err := planner.Plan(context.Background(), spate.PlanContext{Generation: 1})
		if err != nil {
			return err
		}
		for _, s := range plan.Splits {
			c.durable.specs = append(c.durable.specs, s.Spec)
		}
	}
	c.held = map[spate.SplitID]bool{}
	for _, s := range c.durable.specs {
		p, ok := c.durable.progress[s.ID]
		if ok && p.Completed {
			continue
		}
		ev := spate.Gained{Split: s, Epoch: 1}
		if ok {
			p := p
			ev.Progress = &p
		}
		c.pending = append(c.pending, ev)
		c.held[s.ID] = true
	}
	return nil
}

func (c *localCoord) Poll() ([]spate.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs := c.pending
	c.pending = nil
	if !c.finished {
		c.durable.mu.Lock()
		done := 0
		for _, s := range c.durable.specs {
			if c.durable.progress[s.ID].Completed {
				done++
			}
		}
		c.durable.mu.Unlock()
		if done == len(c.durable.specs) {
			c.finished = true
			evs = append(evs, spate.AllComplete{})
		}
	}
	return evs, nil
}

func (c *localCoord) CommitAt(_ context.Context, s spate.SplitID, _ spate.LeaseEpoch, p spate.SplitProgress) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held[s] {
		return spate.Fencedf("not held")
	}
	c.durable.mu.Lock()
	defer c.durable.mu.Unlock()
	if old, ok := c.durable.progress[s]; ok && p.Watermark < old.Watermark {
		return spate.Fatalf("watermark regressed")
	}
	c.durable.progress[s] = p
	if p.Completed {
		delete(c.held, s)
	}
	c.waker.Wake()
	return nil
}

func (c *localCoord) Fail(context.Context, spate.SplitID, string) error { return nil }

func (c *localCoord) Release(_ context.Context, ids ...spate.SplitID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.held, id)
	}
	return nil
}

func (c *localCoord) ReleaseDrained(ctx context.Context, ids ...spate.SplitID) error {
	return c.Release(ctx, ids...)
}

func (c *localCoord) DeclineRevoke(context.Context, spate.SplitID) error { return nil }

func (c *localCoord) Depart(context.Context) error { return nil }

func (c *localCoord) Close() error { return nil }

// outputLines reads a file sink's output back as key -> count.
func outputLines(t *testing.T, fs *pipeline.FileSink, shards int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range shards {
		f, err := os.Open(fs.Path(i))
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			key, _, _ := strings.Cut(sc.Text(), "\t")
			seen[key]++
		}
		f.Close()
	}
	return seen
}

func testConfig() pipeline.Config {
	return pipeline.Config{
		Name: "backfill", Threads: 2, CommitInterval: 20 * time.Millisecond, DrainTimeout: 3 * time.Second,
		PollTimeout: 2 * time.Millisecond, IdleFlush: 5 * time.Millisecond, EventPollTimeout: 5 * time.Millisecond,
		MaxRecords: 64,
	}
}

func sinkOpts() pipeline.SinkOptions {
	return pipeline.SinkOptions{Shards: 2, Linger: 2 * time.Millisecond, ChunkTargetBytes: 4 << 10}
}

// A whole backfill over one instance: every input line reaches the file
// sink, every split completes, and the run ends Completed on its own.
func TestBackfillDeliversEveryLine(t *testing.T) {
	in, outDir := t.TempDir(), t.TempDir()
	lines := corpus(t, in, genCorpus(t, in, 40, 60, 1))
	coord := &localCoord{durable: &localStore{progress: map[spate.SplitID]spate.SplitProgress{}}}
	src := filesource.New(filesource.Dir(in), coord, filesource.PlannerOptions{TargetBytes: 4 << 10, MaxFiles: 4})
	sink, _ := pipeline.NewFileSink(outDir, "out")
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
	sink, _ := pipeline.NewFileSink(outDir, "out")
	defer sink.Close()
	cfg := testConfig()
	cfg.MaxRecords = 8
	cfg.DrainTimeout = 500 * time.Millisecond
	cfg.StopReserve = 400 * time.Millisecond

	// Run 1: stop after some output.
	c1 := &localCoord{durable: store}
	rt1, _ := pipeline.Build(cfg, filesource.New(filesource.Dir(in), c1, filesource.PlannerOptions{TargetBytes: 8 << 10, MaxFiles: 4}), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: sinkOpts()}})
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
	if len(firstRun) == len(lines) {
		t.Skip("run 1 finished everything before the stop; nothing to resume")
	}

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

// A descriptor from the store that no planner could have written is a
// Fatal error, and a directory input refuses names that leave its root.
func TestBadDescriptorsAndEscapingNamesAreRefused(t *testing.T) {
	for _, bad := range []string{
		`{"v":1,"files":[{"name":"a","size":-1,"mtime":0}]}`,
		`{"v":1,"files":[{"name":"","size":3,"mtime":0}]}`,
		`{"v":2,"files":[]}`,
		`{"v":1,"files":[{"name":"a","size":1,"mtime":0,"extra":true}]`,
	} {
		_, err := filesource.DecodeDescriptor([]byte(bad))
		assert.True(t, spate.IsFatal(err), "descriptor %s: %v, want Fatal", bad, err)
	}
	dir := t.TempDir()
	for _, name := range []string{"../outside", "/etc/passwd", "a/../../b"} {
		_, _, err := filesource.Dir(dir).Open(context.Background(), name, 0)
		assert.Error(t, err, "Dir opened %q, which leaves its root", name)
	}
}
