package filesource_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
	"github.com/spate-go/spate/internal/s3test"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/blobsink"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// stagedWorker is a pipeline instance writing through its own
// StagedFileSink into the one destination every worker shares, as
// separate processes would.
type stagedWorker struct {
	name  string
	sink  stagedSink
	coord *spate.StoreCoordinator
	rt    *pipeline.Runtime
	done  chan pipeline.ExitReport
}

// stagedSink is what the workers write through: the file or the blob
// staging sink.
type stagedSink interface {
	pipeline.StagingSink
	pipeline.ChunkedSink
	Close() error
}

// slowStaged is a staging sink whose every write first takes 3ms, so a
// job runs long enough to kill a worker in its middle. Write and
// WriteChunks are both overridden; the staging methods are promoted.
type slowStaged struct{ stagedSink }

func (s slowStaged) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

func (s slowStaged) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	select {
	case <-time.After(3 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.stagedSink.WriteChunks(ctx, shard, chunks)
}

func startStaged(t *testing.T, name string, store spate.Store, in string, newSink func() stagedSink, popts filesource.PlannerOptions) *stagedWorker {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	coord, err := spate.NewStoreCoordinator(store, e2eConfig(name, 4), spate.WithLogger(quiet))
	require.NoError(t, err)
	sink := newSink()
	pcfg := testConfig()
	pcfg.Name = name
	pcfg.MaxRecords = 16
	pcfg.DrainTimeout = time.Second
	sopts := sinkOpts()
	sopts.BatchMaxRecords = 8
	rt, err := pipeline.Build(pcfg, filesource.New(filesource.Dir(in), coord, popts), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: slowStaged{sink}, Options: sopts}}, pipeline.WithLogger(quiet))
	require.NoError(t, err)
	w := &stagedWorker{name: name, sink: sink, coord: coord, rt: rt, done: make(chan pipeline.ExitReport, 1)}
	go func() {
		r, _ := rt.Run(context.Background())
		w.done <- r
	}()
	return w
}

func (w *stagedWorker) wait(t *testing.T) pipeline.ExitReport {
	t.Helper()
	select {
	case r := <-w.done:
		_ = w.coord.Close()
		_ = w.sink.Close()
		return r
	case <-time.After(60 * time.Second):
		require.FailNowf(t, "a worker did not finish", "%s", w.name)
		return pipeline.ExitReport{}
	}
}

// publishedLines counts every line of the published files, DST/*.out, by
// key (path:offset).
func publishedLines(t *testing.T, dst string) map[string]int { return publishedDirBy(t, dst, lineKey) }

// publishedDirBy counts every line of DST/*.out by what part says of it.
func publishedDirBy(t *testing.T, dst string, part func(string) string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	outs, err := filepath.Glob(filepath.Join(dst, "*.out"))
	require.NoError(t, err)
	for _, path := range outs {
		f, err := os.Open(path)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			seen[part(sc.Text())]++
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	return seen
}

// lineKey and lineValue are an output line's key (path:offset) and text.
func lineKey(line string) string {
	k, _, _ := strings.Cut(line, "\t")
	return k
}

func lineValue(line string) string {
	_, v, _ := strings.Cut(line, "\t")
	return v
}

// exactlyOnce reports the lines of input missing from seen and the
// duplicate writes in it.
func exactlyOnce(lines map[string]string, seen map[string]int) (missing, dups, alien int) {
	for key := range lines {
		switch n := seen[key]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	for key := range seen {
		if _, ok := lines[key]; !ok {
			alien++
		}
	}
	return
}

// Three pipelines write one destination through staging sinks; one of
// them becomes a zombie mid-run: cut off from the store, it keeps polling,
// staging and trying to commit until the survivors, which took its splits
// over after its leases expired, have finished the job. The published
// output holds every input line exactly once: nothing the zombie staged
// after its last won commit is visible, and nothing it committed is lost.
// It runs to a directory (StagedFileSink) and to a bucket over the S3 wire
// protocol (blobsink, gofakes3 through s3blob).
func TestStagedOutputIsExactlyOnceThroughAZombie(t *testing.T) {
	t.Run("dir", func(t *testing.T) {
		dst := t.TempDir()
		newSink := func() stagedSink {
			sink, err := filesink.NewStagedFileSink(dst, "e2e")
			require.NoError(t, err)
			return sink
		}
		zombieRun(t, newSink, func() map[string]int { return publishedLines(t, dst) })
		// Only published files under the final names; a completed job
		// leaves no staging behind but the zombie's (removed by
		// RemoveStaging).
		entries, err := os.ReadDir(dst)
		require.NoError(t, err)
		for _, e := range entries {
			if e.Name() == ".spate" {
				continue
			}
			require.True(t, strings.HasSuffix(e.Name(), ".out"), "unexpected %s in the destination", e.Name())
		}
		require.NoError(t, filesink.RemoveStaging(dst))
		left, err := os.ReadDir(filepath.Join(dst, ".spate", "stage"))
		require.NoError(t, err)
		require.Empty(t, left)
	})
	t.Run("s3", func(t *testing.T) {
		b := s3test.Open(t, s3test.Start(t).Bucket(t, "out", ""))
		newSink := func() stagedSink {
			sink, err := blobsink.New(context.Background(), b, "s3://out/", "e2e")
			require.NoError(t, err)
			sink.RollSize = 4 << 10 // parts of a few KiB: several per split
			return sink
		}
		zombieRun(t, newSink, func() map[string]int { return publishedBlobLines(t, b) })
		require.NoError(t, blobsink.RemoveStaging(context.Background(), b))
		it := b.List(&blob.ListOptions{})
		for {
			obj, err := it.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			if obj.Key == ".spate/job" {
				continue
			}
			require.True(t, strings.HasSuffix(obj.Key, ".out") && !strings.HasPrefix(obj.Key, ".spate/"), "unexpected %s in the bucket", obj.Key)
		}
	})
}

// publishedBlobLines counts every line of the parts in b by key.
func publishedBlobLines(t *testing.T, b *blob.Bucket) map[string]int {
	return publishedBlobBy(t, b, lineKey)
}

// publishedBlobBy counts every line of the parts in b by what part says
// of it.
func publishedBlobBy(t *testing.T, b *blob.Bucket, part func(string) string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	it := b.List(&blob.ListOptions{})
	for {
		obj, err := it.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return seen
		}
		require.NoError(t, err)
		if strings.HasPrefix(obj.Key, ".spate/") || !strings.HasSuffix(obj.Key, ".out") {
			continue
		}
		data, err := b.ReadAll(context.Background(), obj.Key)
		require.NoError(t, err)
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			seen[part(line)]++
		}
	}
}

func zombieRun(t *testing.T, newSink func() stagedSink, published func() map[string]int) {
	in := t.TempDir()
	lines := corpus(t, in, genCorpus(t, in, 48, 400, 3))
	popts := filesource.PlannerOptions{TargetBytes: 16 << 10, MaxFiles: 4}

	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	handle := func() *mem.Store {
		h, err := store.Connect()
		require.NoError(t, err)
		return h
	}
	inj := faultstore.New()
	zh := handle()
	defer zh.Close()
	zombie := startStaged(t, "zombie", faultstore.Wrap(zh, inj), in, newSink, popts)
	waitFor(t, "zombie output", func() bool { return len(published()) > len(lines)/10 })
	h1, h2 := handle(), handle()
	defer h1.Close()
	defer h2.Close()
	survivors := []*stagedWorker{
		startStaged(t, "survivor-1", h1, in, newSink, popts),
		startStaged(t, "survivor-2", h2, in, newSink, popts),
	}
	observer := handle()
	defer observer.Close()
	waitFor(t, "survivors holding splits", func() bool {
		snap, err := spate.InspectJob(context.Background(), observer, "")
		require.NoError(t, err)
		owners := map[string]bool{}
		for _, s := range snap.Splits {
			if s.LeaseOwner != "" {
				owners[s.LeaseOwner] = true
			}
		}
		return owners["zombie"] && owners["survivor-1"] && owners["survivor-2"]
	})
	inj.Partition()
	snap, err := spate.InspectJob(context.Background(), observer, "")
	require.NoError(t, err)
	zombieHeld := 0
	for _, s := range snap.Splits {
		if s.LeaseOwner == "zombie" {
			zombieHeld++
		}
	}
	require.Positive(t, zombieHeld, "the zombie held no split when it was cut off: the test shows no takeover")

	for _, w := range survivors {
		r := w.wait(t)
		require.Equal(t, pipeline.Completed, r.State, "%s: %+v", w.name, r)
	}
	// The zombie ran on through the whole takeover; only now is it
	// stopped.
	zombie.rt.Stop()
	zombie.wait(t)

	final, err := spate.InspectJob(context.Background(), observer, "")
	require.NoError(t, err)
	for _, s := range final.Splits {
		require.Equal(t, spate.StatusCompleted, s.Status, "split %s", s.ID)
	}
	seen := published()
	missing, dups, alien := exactlyOnce(lines, seen)
	t.Logf("%d lines; the zombie held %d splits when cut off; published: %d missing, %d duplicates, %d alien", len(lines), zombieHeld, missing, dups, alien)
	require.Zero(t, missing, "lines missing from the published output")
	require.Zero(t, dups, "duplicate lines in the published output")
	require.Zero(t, alien, "lines in the published output that are not in the input")
}
