package filesource_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// parkRelease is the tests' ReleaseAfter: short, so a file parks soon
// after its last write; nothing below waits for it by the clock.
const parkRelease = 300 * time.Millisecond

// parker is one follower of startParking: it reads the directory in,
// writes to the staging directory dst, holds at most lanes splits at once
// and logs its source's and planner's events to events.
type parker struct {
	name    string
	in, dst string
	lanes   int
	popts   filesource.PlannerOptions
	events  *recorded
}

// startParking starts one follower whose source obeys the planner's
// options (ReleaseAfter).
func startParking(t *testing.T, store spate.Store, p parker) *stagedWorker {
	t.Helper()
	name, in, dst, lanes, popts, events := p.name, p.in, p.dst, p.lanes, p.popts, p.events
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	coord, err := spate.NewStoreCoordinator(store, e2eConfig(name, lanes), spate.WithLogger(quiet))
	require.NoError(t, err)
	sink, err := pipeline.NewStagedFileSink(dst, "park")
	require.NoError(t, err)
	pcfg := testConfig()
	pcfg.Name = name
	pcfg.DrainTimeout = time.Second
	objs := filesource.Dir(in)
	popts.Logger = slog.New(events)
	planner := filesource.NewPlanner(objs, popts)
	src := pipeline.NewCoordinatedSource(coord, filesource.NewSource(objs).WithLogger(slog.New(events)).WithPlanner(planner), planner)
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

// splitOf is the state of the split that follows the file found at name.
func splitOf(t *testing.T, store *mem.Store, name string) (spate.SplitState, bool) {
	t.Helper()
	snap, err := spate.InspectJob(context.Background(), store, "")
	if err != nil {
		return spate.SplitState{}, false
	}
	for _, s := range snap.Splits {
		if d, err := filesource.DecodeDescriptor(s.Descriptor); err == nil && d.Tail != nil && d.Tail.Name == name {
			return s, true
		}
	}
	return spate.SplitState{}, false
}

// countOnce checks the published output against the ledger: every line
// written is published exactly once.
func countOnce(t *testing.T, ledger map[string]bool, seen map[string]int) {
	t.Helper()
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
	t.Logf("%d lines written; published: %d missing, %d duplicates, %d alien", len(ledger), missing, dups, alien)
	require.Zero(t, missing, "lines lost: written, never published")
	require.Zero(t, dups, "duplicate lines in the published output")
	require.Zero(t, alien, "published lines that were never written")
}

// A followed file that was renamed away and went idle is read to its end
// and parked: its split stays, so when the file grows again (a writer
// that had not reopened its log yet) the new lines are read from where
// the split stopped: none lost, none twice.
func TestARenamedIdleFileThatGrowsAgainIsReadOn(t *testing.T) {
	in, dst := t.TempDir(), t.TempDir()
	w := newWriter(t, in)
	defer w.close()
	w.add("app.log", "a", 40)

	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	h, err := store.Connect()
	require.NoError(t, err)
	defer h.Close()
	observer, err := store.Connect()
	require.NoError(t, err)
	defer observer.Close()
	events := &recorded{}
	popts := filesource.PlannerOptions{Follow: true, ReleaseAfter: parkRelease, UntilIdle: 3 * time.Second}
	wk := startParking(t, h, parker{name: "w1", in: in, dst: dst, lanes: 2, popts: popts, events: events})
	published := func(line string) bool { return publishedValues(t, dst)[line] > 0 }

	waitFor(t, "the first lines published", func() bool { return published(lineText("a", 40)) })
	require.NoError(t, os.Rename(filepath.Join(in, "app.log"), filepath.Join(in, "app.log.1")))
	w.add("app.log", "a", 10) // the writer's open descriptor: lands in app.log.1
	waitFor(t, "the renamed file read to its end and let go", func() bool {
		return events.has("a followed file that was renamed away and is idle")
	})
	waitFor(t, "the let-go state committed", func() bool {
		s, ok := splitOf(t, observer, "app.log")
		return ok && s.Progress != nil && (s.Progress.Parked || s.Progress.Completed)
	})
	// It grows again: the writer had not reopened its log.
	w.add("app.log", "a", 30)
	w.close()

	// Idle input: the plan turns final and the job ends.
	r := wk.wait(t)
	require.Equal(t, pipeline.Completed, r.State, "%+v", r)
	countOnce(t, w.ledger(), publishedValues(t, dst))
	require.True(t, events.has("a parked followed file grew"), "the renamed file's growth did not wake its split")
}

// With one lane, a file that has gone idle parks and hands its lane to a
// live file that waits for one, keeping its split; when the idle file
// grows again it is read on from where it stopped. Every line of both
// files is published once.
func TestAnIdleFileGivesItsLaneToALiveOne(t *testing.T) {
	in, dst := t.TempDir(), t.TempDir()
	w := newWriter(t, in)
	defer w.close()
	w.add("idle.log", "i", 30)

	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	h, err := store.Connect()
	require.NoError(t, err)
	defer h.Close()
	observer, err := store.Connect()
	require.NoError(t, err)
	defer observer.Close()
	events := &recorded{}
	popts := filesource.PlannerOptions{Follow: true, ReleaseAfter: parkRelease, UntilIdle: 3 * time.Second}
	wk := startParking(t, h, parker{name: "w1", in: in, dst: dst, lanes: 1, popts: popts, events: events})
	published := func(line string) bool { return publishedValues(t, dst)[line] > 0 }

	waitFor(t, "idle.log published", func() bool { return published(lineText("i", 30)) })
	idle, ok := splitOf(t, observer, "idle.log")
	require.True(t, ok)
	epoch := idle.Epoch

	// A live file appears while idle.log holds the one lane.
	w.add("live.log", "l", 20)
	waitFor(t, "live.log published while idle.log holds the only lane", func() bool {
		if published(lineText("l", 20)) {
			return true
		}
		w.add("live.log", "l", 1) // live: it keeps growing
		time.Sleep(20 * time.Millisecond)
		return false
	})
	idle, ok = splitOf(t, observer, "idle.log")
	require.True(t, ok)
	require.Equal(t, spate.StatusRunnable, idle.Status, "the idle file's split ended instead of parking")
	require.Equal(t, "w1", idle.LeaseOwner, "the idle file's split was handed back instead of kept")
	require.Equal(t, epoch, idle.Epoch, "the idle file's split changed hands")

	// The idle file grows again: it is read on.
	w.add("idle.log", "i", 25)
	waitFor(t, "idle.log's new lines published", func() bool { return published(lineText("i", 55)) })
	w.add("live.log", "l", 5)
	w.close()

	r := wk.wait(t)
	require.Equal(t, pipeline.Completed, r.State, "%+v", r)
	countOnce(t, w.ledger(), publishedValues(t, dst))
}
