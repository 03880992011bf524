package filesource_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
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
	sink, err := filesink.NewStagedFileSink(dst, "park")
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

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Many parked files do not hold a descriptor each: a parked file's
// descriptor is closed, and the file is opened again (checked to be the
// same file) when it grows, under its name or the one it was renamed to;
// one deleted while parked completes its split. 50 files park; the
// process's open descriptors stay within a few of what they were before
// the lanes opened.
func TestParkedFilesHoldNoDescriptor(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts descriptors in /proc/self/fd and needs file identities (Linux)")
	}
	const n = 50
	dir := t.TempDir()
	files := map[string]string{}
	for i := range n {
		files[fmt.Sprintf("app%02d.log", i)] = fmt.Sprintf("f%02d-1\n", i)
	}
	corpus(t, dir, files)
	past := time.Now().Add(-time.Hour)
	for name := range files {
		require.NoError(t, os.Chtimes(filepath.Join(dir, name), past, past))
	}
	var logs logLines
	planner := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true, Logger: logs.logger(), ReleaseAfter: time.Minute})
	plan, err := planner.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Len(t, plan.Splits, n)
	src := filesource.NewSource(filesource.Dir(dir)).WithLogger(logs.logger()).WithPlanner(planner)

	before := openFDs(t)
	lanes := map[string]pipeline.Lane{}
	ids := map[string]spate.SplitID{}
	for _, sp := range plan.Splits {
		d, err := filesource.DecodeDescriptor(sp.Spec.Descriptor)
		require.NoError(t, err)
		require.NotNil(t, d.Tail)
		lanes[d.Tail.Name] = openLane(t, src, sp.Spec, nil, pipeline.NewCheckpointer(nil), nil)
		ids[d.Tail.Name] = sp.Spec.ID
		defer src.CloseSplit(sp.Spec.ID)
	}
	for name, l := range lanes {
		lines := pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 1 })
		require.Equal(t, []string{strings.TrimSuffix(files[name], "\n")}, lines, name)
		c, err := src.EncodeCommit(ids[name], int64(len(files[name])))
		require.NoError(t, err)
		if !c.Parked {
			var p *spate.SplitProgress
			pollTail(t, l, 500, func([]string) bool {
				p, err = src.Sweep(ids[name])
				require.NoError(t, err)
				return p != nil
			})
			require.True(t, p != nil && p.Parked, "%s did not park", name)
		}
	}
	held := openFDs(t) - before
	t.Logf("%d parked files hold %d descriptors", n, held)
	require.Less(t, held, 5, "%d parked files hold %d descriptors: a parked file keeps its descriptor open", n, held)

	// app07.log grows: read on from where it stopped.
	appendTo := func(name, s string) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteString(s)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	appendTo("app07.log", "f07-2\n")
	require.Equal(t, []string{"f07-2"}, pollTail(t, lanes["app07.log"], 500, func(ls []string) bool { return len(ls) == 1 }))

	// app08.log is renamed while parked, then grows: read on under its new name.
	require.NoError(t, os.Rename(filepath.Join(dir, "app08.log"), filepath.Join(dir, "app08.log.1")))
	appendTo("app08.log.1", "f08-2\n")
	require.Equal(t, []string{"f08-2"}, pollTail(t, lanes["app08.log"], 500, func(ls []string) bool { return len(ls) == 1 }))
	assert.Equal(t, 1, logs.count("was renamed", "app08.log"))

	// A new file at app09.log's name, after app09.log was renamed away, is
	// not app09.log's: its split is not fooled into reading it.
	require.NoError(t, os.Rename(filepath.Join(dir, "app09.log"), filepath.Join(dir, "app09.log.1")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app09.log"), []byte("other\n"), 0o644))
	require.Empty(t, pollTail(t, lanes["app09.log"], 20, func(ls []string) bool { return len(ls) > 0 }))

	// app10.log is deleted while parked: its split completes.
	require.NoError(t, os.Remove(filepath.Join(dir, "app10.log")))
	var p *spate.SplitProgress
	pollTail(t, lanes["app10.log"], 500, func([]string) bool {
		p, err = src.Sweep(ids["app10.log"])
		require.NoError(t, err)
		return p != nil && p.Completed
	})
	require.True(t, p != nil && p.Completed, "a parked file deleted: its split did not complete")
}

// A followed file truncated and written past its committed offset while
// no worker held its split (logrotate's copytruncate during a takeover)
// is read again from its start by the next owner: its new lines are
// shipped, and the split is not failed as an input that drifted (the old
// code: "resume offset 9 of app.log is not on a line boundary", then
// quarantine), nor resumed mid-content where the new bytes happen to end
// a line there (the old code skipped the new file's first line).
func TestATailTruncatedAndRewrittenWhileUnheldIsReadFromItsStart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    []string
	}{
		{"mid-line at the old offset", "n1-long\nn2\n", []string{"n1-long", "n2"}},
		{"a line ends at the old offset", "n1-abcde\nn2\n", []string{"n1-abcde", "n2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			corpus(t, dir, map[string]string{"app.log": "o1\no2\no3\n"})
			var logs logLines
			planner := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true, Logger: logs.logger()})
			plan, err := planner.Plan(context.Background(), spate.PlanContext{})
			require.NoError(t, err)
			require.Len(t, plan.Splits, 1)
			spec := plan.Splits[0].Spec

			src := filesource.NewSource(filesource.Dir(dir)).WithLogger(logs.logger()).WithPlanner(planner)
			l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil)
			require.Equal(t, []string{"o1", "o2", "o3"}, pollTail(t, l, 500, func(ls []string) bool { return len(ls) == 3 }))
			p, err := src.EncodeCommit(spec.ID, 9)
			require.NoError(t, err)
			src.CloseSplit(spec.ID)

			// copytruncate while nobody holds the split; the application
			// writes on, past the committed offset, before a worker resumes.
			require.NoError(t, os.WriteFile(filepath.Join(dir, "app.log"), []byte(tc.content), 0o644))

			next := filesource.NewSource(filesource.Dir(dir)).WithLogger(logs.logger()).WithPlanner(planner)
			l2 := openLane(t, next, spec, &p, pipeline.NewCheckpointer(nil), nil)
			defer next.CloseSplit(spec.ID)
			require.Equal(t, tc.want, pollTail(t, l2, 500, func(ls []string) bool { return len(ls) >= len(tc.want) }))
			assert.Equal(t, 1, logs.count("truncated and written again while no worker held its split", "app.log"))
		})
	}
}
