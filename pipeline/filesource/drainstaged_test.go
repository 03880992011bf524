package filesource_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/promtest"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// refusalLog is a staging sink that keeps every error its Prepare returns.
type refusalLog struct {
	stagedSink
	mu      sync.Mutex
	refused []string
}

func (r *refusalLog) Prepare(ctx context.Context, p pipeline.PartitionID, watermark int64, final bool) ([]byte, int64, bool, error) {
	out, covered, pending, err := r.stagedSink.Prepare(ctx, p, watermark, final)
	if err != nil {
		r.mu.Lock()
		r.refused = append(r.refused, err.Error())
		r.mu.Unlock()
	}
	return out, covered, pending, err
}

func (r *refusalLog) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.refused...)
}

// slowerStaged is slowStaged at 20 ms a write.
type slowerStaged struct{ stagedSink }

func (s slowerStaged) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

func (s slowerStaged) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	select {
	case <-time.After(20 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.stagedSink.WriteChunks(ctx, shard, chunks)
}

// A worker that holds every split, writing through the real file sink
// publishing whole files (spate backfill's bounded default), is joined by
// a second one: the splits moved to it are revoked with batches in flight
// (a slow sink, 64 splits in flight). Each drain commits what is
// acknowledged so far and then the rest; only its last commit may be
// final, since the sink seals the staging file at a final commit and
// refuses every later one. Were the first final, the drain's own commit
// would be refused on every poll and the split held until its revocation
// was forced at the deadline. Every drain here hands its split back: the
// sink refuses no commit, no revocation is forced, and the published
// output holds every line exactly once.
func TestRevokedSplitsDrainIntoTheWholeFileSink(t *testing.T) {
	in := t.TempDir()
	lines := corpus(t, in, genCorpus(t, in, 24, 200, 6))
	popts := filesource.PlannerOptions{TargetBytes: 8 << 10, MaxFiles: 2}
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	dst := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	type drainWorker struct {
		*stagedWorker
		log *refusalLog
	}
	start := func(name string, reg prometheus.Registerer) drainWorker {
		cfg := e2eConfig(name, 64)
		coord, err := spate.NewStoreCoordinator(store, cfg, spate.WithLogger(quiet), spate.WithRegisterer(reg))
		require.NoError(t, err)
		sink, err := filesink.NewStagedFileSink(dst, "drain")
		require.NoError(t, err)
		sink.PublishWhole = true
		log := &refusalLog{stagedSink: sink}
		// Writes of 20 ms: the lanes read far ahead of the sink, so a
		// revoked split has batches in flight.
		pcfg := testConfig()
		pcfg.Name = name
		pcfg.MaxRecords = 16
		sopts := sinkOpts()
		sopts.BatchMaxRecords = 8
		rt, err := pipeline.Build(pcfg, filesource.New(filesource.Dir(in), coord, popts), nil,
			[]pipeline.SinkSpec{{Name: "file", Sink: slowerStaged{log}, Options: sopts}}, pipeline.WithLogger(quiet))
		require.NoError(t, err)
		w := &stagedWorker{name: name, sink: sink, coord: coord, rt: rt, done: make(chan pipeline.ExitReport, 1)}
		go func() {
			r, _ := rt.Run(context.Background())
			w.done <- r
		}()
		return drainWorker{w, log}
	}
	reg := prometheus.NewRegistry()
	first := start("first", reg)
	// The second worker joins once the first has committed part of a few
	// splits: it takes them over while they run.
	waitFor(t, "the first worker's progress", func() bool {
		js, err := spate.InspectJob(context.Background(), store, "")
		if err != nil {
			return false // no plan yet
		}
		running := 0
		for _, s := range js.Splits {
			if s.Progress != nil && s.Progress.Watermark > 0 && s.Status != spate.StatusCompleted {
				running++
			}
		}
		return running >= 3
	})
	second := start("second", prometheus.NewRegistry())
	for _, w := range []drainWorker{first, second} {
		r := w.wait(t)
		require.Equal(t, pipeline.Completed, r.State, "%s: %+v", w.name, r)
		require.Zero(t, r.UnresolvedAcks, "%s: %+v", w.name, r)
	}
	drained := counter(t, reg, "spate_coordination_revocations_total", "outcome", "drained")
	forced, _, err := promtest.Value(reg, "spate_coordination_revocations_total", "outcome", "forced")
	require.NoError(t, err)
	t.Logf("revocations of the first worker: %v drained, %v forced", drained, forced)
	for _, w := range []drainWorker{first, second} {
		refused := w.log.errors()
		sealed := 0
		for _, e := range refused {
			if strings.Contains(e, "past its final commit") {
				sealed++
			}
		}
		require.Zero(t, sealed, "%s: the file sink refused %d commits past a drain's final one, the first: %v", w.name, sealed, refused[:min(len(refused), 2)])
	}
	require.Zero(t, forced, "a revocation was forced: a drain did not hand its split back")
	require.NotZero(t, drained, "no split was revoked from the first worker: the test shows no drain")
	missing, dups, alien := exactlyOnce(lines, publishedLines(t, dst))
	require.Zero(t, missing, "lines lost")
	require.Zero(t, dups, "lines repeated")
	require.Zero(t, alien, "lines that are no input line")
}
