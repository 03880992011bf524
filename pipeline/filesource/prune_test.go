package filesource_test

import (
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
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// A followed directory whose logs rotate (logrotate's create: the old
// copy deleted, the log renamed to it, a new log) keeps in the store only
// the splits of the files that are there: once a rotated file is deleted
// and its split's completion is older than Retain, the leader prunes it.
// The output holds every line written exactly once.
func TestFollowPrunesTheSplitsOfRotatedFilesThatAreGone(t *testing.T) {
	in, dst := t.TempDir(), t.TempDir()
	w := newWriter(t, in)
	defer w.close()
	apps := []string{"a", "b", "c"}
	for _, app := range apps {
		w.add(app+".log", app, 5)
	}
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	newSink := func() stagedSink {
		sink, err := filesink.NewStagedFileSink(dst, "prune")
		require.NoError(t, err)
		return sink
	}
	popts := filesource.PlannerOptions{Follow: true, Retain: 300 * time.Millisecond, ReleaseAfter: 200 * time.Millisecond, Discover: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}
	var workers []*stagedWorker
	for _, name := range []string{"w1", "w2"} {
		h, err := store.Connect()
		require.NoError(t, err)
		defer h.Close()
		workers = append(workers, startFollower(t, name, h, in, newSink, popts, &recorded{}))
	}
	published := func(line string) bool { return publishedValues(t, dst)[line] > 0 }
	records := func() int {
		es, err := store.List(context.Background(), spate.Durable, "split.")
		require.NoError(t, err)
		return len(es)
	}

	const rounds = 10
	most := 0
	for r := range rounds {
		for _, app := range apps {
			w.add(app+".log", app, 5)
		}
		for _, app := range apps {
			waitFor(t, "the lines of "+app+".log published", func() bool { return published(lineText(app, 10*(r+1))) })
		}
		for _, app := range apps {
			path := filepath.Join(in, app+".log")
			if err := os.Remove(path + ".1"); err != nil {
				require.ErrorIs(t, err, os.ErrNotExist)
			}
			require.NoError(t, os.Rename(path, path+".1"))
			w.reopen(app + ".log")
			w.add(app+".log", app, 5)
		}
		most = max(most, records())
	}
	// 3 live logs and 3 rotated copies are left; 3 × 10 files were
	// deleted. Their splits complete, and are pruned after Retain.
	waitFor(t, "the splits of the deleted files pruned", func() bool { return records() <= 2*len(apps) })
	ledger := w.ledger()
	waitFor(t, "every line published", func() bool {
		seen := publishedValues(t, dst)
		for l := range ledger {
			if seen[l] == 0 {
				return false
			}
		}
		return true
	})
	for _, wk := range workers {
		wk.rt.Stop()
		r := wk.wait(t)
		assert.Equal(t, pipeline.Stopped, r.State, "%s: %+v", wk.name, r)
	}
	js, err := spate.InspectJob(context.Background(), store, "")
	require.NoError(t, err)
	var left []string
	for _, s := range js.Splits {
		f, ok := filesource.FollowedOf(s.Descriptor, s.Progress)
		require.True(t, ok)
		left = append(left, f.Name)
		_, err := os.Stat(filepath.Join(in, f.Name))
		assert.NoError(t, err, "the split of %s (found as %s) is kept, but its file is gone", f.Name, f.Found)
	}
	assert.Len(t, left, 2*len(apps), "splits kept: %s", strings.Join(left, ", "))
	seen := publishedValues(t, dst)
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
	t.Logf("%d lines in %d files; split records: at most %d during the run, %d at the end", len(ledger), len(apps)*(rounds+1), most, len(js.Splits))
	require.Zero(t, missing, "lines missing from the published output")
	require.Zero(t, dups, "duplicate lines in the published output")
	require.Zero(t, alien, "lines in the published output that were never written")
}
