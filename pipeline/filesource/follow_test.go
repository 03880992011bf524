package filesource_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
	"github.com/spate-go/spate/internal/s3test"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/blobsink"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// writer appends numbered lines to the files of a followed directory and
// keeps the ledger of every line it wrote: each line's text is unique.
type writer struct {
	t    *testing.T
	dir  string
	mu   sync.Mutex
	n    map[string]int
	all  map[string]bool
	open map[string]*os.File
}

func newWriter(t *testing.T, dir string) *writer {
	return &writer{t: t, dir: dir, n: map[string]int{}, all: map[string]bool{}, open: map[string]*os.File{}}
}

// add appends k lines to the file at name (created if absent), through
// a descriptor the writer keeps open, as a logging process would: a
// rename does not move its writes.
func (w *writer) add(name, stream string, k int) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.open[name]
	if f == nil {
		var err error
		f, err = os.OpenFile(filepath.Join(w.dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(w.t, err)
		w.open[name] = f
	}
	var b strings.Builder
	for range k {
		w.n[stream]++
		line := lineText(stream, w.n[stream])
		w.all[line] = true
		b.WriteString(line + "\n")
	}
	_, err := f.WriteString(b.String())
	require.NoError(w.t, err)
}

// reopen has the next add to name create the file anew (the writer was
// told the file rotated).
func (w *writer) reopen(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f := w.open[name]; f != nil {
		f.Close()
		delete(w.open, name)
	}
}

func (w *writer) close() {
	for name := range w.open {
		w.reopen(name)
	}
}

// lineText is the text of a stream's n-th line.
func lineText(stream string, n int) string {
	return fmt.Sprintf("%s-%06d %s", stream, n, strings.Repeat("x", n%40))
}

func (w *writer) ledger() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]bool, len(w.all))
	for l := range w.all {
		out[l] = true
	}
	return out
}

// publishedValues counts every published line of DST/*.out by its text.
func publishedValues(t *testing.T, dst string) map[string]int {
	return publishedDirBy(t, dst, lineValue)
}

// A followed directory is copied exactly once while it changes and its
// workers fail: files appear, grow, are renamed away with a new file in
// their place, truncated and deleted; one worker is cut off from the
// store mid-run (a zombie, still reading and staging) and another joins.
// Once the input is idle the plan turns final, every split completes, and
// the published output holds every line written exactly once.
func TestFollowedDirectoryIsCopiedExactlyOnce(t *testing.T) {
	t.Run("dir", func(t *testing.T) {
		dst := t.TempDir()
		followRun(t, func() stagedSink {
			sink, err := filesink.NewStagedFileSink(dst, "follow")
			require.NoError(t, err)
			return sink
		}, func() map[string]int { return publishedValues(t, dst) })
	})
	t.Run("s3", func(t *testing.T) {
		b := s3test.Open(t, s3test.Start(t).Bucket(t, "out", ""))
		followRun(t, func() stagedSink {
			sink, err := blobsink.New(context.Background(), b, "s3://out/", "follow")
			require.NoError(t, err)
			sink.RollInterval = 300 * time.Millisecond // parts within a commit or so of the lines
			return sink
		}, func() map[string]int { return publishedBlobBy(t, b, lineValue) })
	})
}

// followRun is the followed-directory run over one kind of staging sink;
// published counts the published lines by their text.
func followRun(t *testing.T, newSink func() stagedSink, publishedNow func() map[string]int) {
	in := t.TempDir()
	w := newWriter(t, in)
	defer w.close()
	w.add("a.log", "a", 50)
	w.add("b.log", "b1", 50)
	w.add("t.log", "t1", 30)
	w.add("gone.log", "gone", 20)

	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	handle := func() *mem.Store {
		h, err := store.Connect()
		require.NoError(t, err)
		return h
	}
	popts := filesource.PlannerOptions{Follow: true, UntilIdle: 3 * time.Second}
	events := &recorded{} // what the sources logged
	inj := faultstore.New()
	zh := handle()
	defer zh.Close()
	workers := []*stagedWorker{startFollower(t, "w1", faultstore.Wrap(zh, inj), in, newSink, popts, events)}
	for _, name := range []string{"w2", "w3"} {
		h := handle()
		defer h.Close()
		workers = append(workers, startFollower(t, name, h, in, newSink, popts, events))
	}
	published := func(line string) bool { return publishedNow()[line] > 0 }

	// Growth is followed within a commit, new files within a replan.
	waitFor(t, "the first lines published", func() bool { return published(lineText("a", 50)) })
	w.add("a.log", "a", 50)
	waitFor(t, "appended lines published", func() bool { return published(lineText("a", 100)) })
	w.add("c.log", "c", 40)

	// Rotation: b.log renamed, its writer still writing to it a little,
	// then a new b.log.
	require.NoError(t, os.Rename(filepath.Join(in, "b.log"), filepath.Join(in, "b.log.1")))
	w.add("b.log", "b1", 10) // the open descriptor: lands in b.log.1
	w.reopen("b.log")
	w.add("b.log", "b2", 30)

	// The zombie: cut off from the store while it holds splits, it keeps
	// reading and staging.
	observer := handle()
	defer observer.Close()
	waitFor(t, "w1 holding a split", func() bool {
		snap, err := spate.InspectJob(context.Background(), observer, "")
		require.NoError(t, err)
		for _, s := range snap.Splits {
			if s.LeaseOwner == "w1" {
				return true
			}
		}
		return false
	})
	inj.Partition()
	h4 := handle()
	defer h4.Close()
	workers = append(workers, startFollower(t, "w4", h4, in, newSink, popts, events))

	// Truncation: once t.log's lines are all published, it is truncated
	// and written again.
	waitFor(t, "t.log published", func() bool { return published(lineText("t1", 30)) })
	w.reopen("t.log")
	require.NoError(t, os.Truncate(filepath.Join(in, "t.log"), 0))
	w.add("t.log", "t2", 25)

	// Deletion of a file whose lines were read.
	waitFor(t, "gone.log published", func() bool { return published(lineText("gone", 20)) })
	w.reopen("gone.log")
	require.NoError(t, os.Remove(filepath.Join(in, "gone.log")))

	for range 10 {
		w.add("a.log", "a", 20)
		w.add("c.log", "c", 5)
		w.add("b.log", "b2", 5)
		time.Sleep(100 * time.Millisecond)
	}
	w.close()

	// Idle input: the plan turns final and the job completes.
	for _, wk := range workers[1:] {
		r := wk.wait(t)
		require.Equal(t, pipeline.Completed, r.State, "%s: %+v", wk.name, r)
	}
	workers[0].rt.Stop()
	workers[0].wait(t)

	final, err := spate.InspectJob(context.Background(), observer, "")
	require.NoError(t, err)
	assert.Equal(t, spate.PlanFinal, final.Plan.Finality)
	for _, s := range final.Splits {
		require.Equal(t, spate.StatusCompleted, s.Status, "split %s", s.ID)
	}

	ledger := w.ledger()
	seen := publishedNow()
	missing, dups, alien := 0, 0, 0
	for l := range ledger {
		switch n := seen[l]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	for l := range seen {
		if !ledger[l] {
			alien++
		}
	}
	for _, want := range []string{"was truncated", "was deleted", "was renamed"} {
		assert.True(t, events.has(want), "no warning that a followed file %s", want)
	}
	t.Logf("%d lines written to %d files; %d splits; published: %d missing, %d duplicates, %d alien", len(ledger), 6, len(final.Splits), missing, dups, alien)
	require.Zero(t, missing, "lines missing from the published output")
	require.Zero(t, dups, "duplicate lines in the published output")
	require.Zero(t, alien, "lines in the published output that were never written")
}

// recorded keeps the messages of the followers' sources.
type recorded struct {
	mu     sync.Mutex
	msgs   []string
	files  []string     // each message's "file" attribute
	levels []slog.Level // each message's level
}

func (r *recorded) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorded) Handle(_ context.Context, rec slog.Record) error {
	file := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "file" {
			file = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.files = append(r.files, file)
	r.levels = append(r.levels, rec.Level)
	r.mu.Unlock()
	return nil
}
func (r *recorded) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorded) WithGroup(string) slog.Handler      { return r }

func (r *recorded) has(part string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

func startFollower(t *testing.T, name string, store spate.Store, in string, newSink func() stagedSink, popts filesource.PlannerOptions, events *recorded) *stagedWorker {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	coord, err := spate.NewStoreCoordinator(store, e2eConfig(name, 8), spate.WithLogger(quiet))
	require.NoError(t, err)
	sink := newSink()
	pcfg := testConfig()
	pcfg.Name = name
	pcfg.DrainTimeout = time.Second
	objs := filesource.Dir(in)
	src := pipeline.NewCoordinatedSource(coord, filesource.NewSource(objs).WithLogger(slog.New(events)), filesource.NewPlanner(objs, popts))
	rt, err := pipeline.Build(pcfg, src, nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: sinkOpts()}}, pipeline.WithLogger(quiet))
	require.NoError(t, err)
	wk := &stagedWorker{name: name, sink: sink, coord: coord, rt: rt, done: make(chan pipeline.ExitReport, 1)}
	go func() {
		r, _ := rt.Run(context.Background())
		wk.done <- r
	}()
	return wk
}
