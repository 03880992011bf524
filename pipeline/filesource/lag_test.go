package filesource

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// tailSplit is a followed file's split state as the store would hold it.
func tailSplit(t *testing.T, root, id, found string, p *spate.SplitProgress, lease string, written time.Time) spate.SplitState {
	t.Helper()
	fid, err := identify(filepath.Join(root, found))
	require.NoError(t, err)
	desc, err := json.Marshal(Descriptor{Version: PackingVersion, Tail: &Tail{Name: found, FileID: fid}})
	require.NoError(t, err)
	return spate.SplitState{ID: spate.MustSplitID(id), Status: spate.StatusRunnable, Descriptor: desc, HasSpec: true,
		Progress: p, LeaseOwner: lease, WrittenAt: written}
}

func tailProgress(t *testing.T, wm int64, st tailState) *spate.SplitProgress {
	t.Helper()
	b, err := json.Marshal(st)
	require.NoError(t, err)
	p := spate.NewSplitProgress(wm, b)
	return &p
}

func TestLagMeterMeasuresEachFollowedFile(t *testing.T) {
	root := t.TempDir()
	write := func(name string, n int) {
		f, err := os.OpenFile(filepath.Join(root, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(t, err)
		_, err = f.Write(make([]byte, n))
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	write("app.log", 100)
	write("waiting.log", 30)
	write("old.log", 10)
	now := time.Now().Add(time.Minute) // after the files were born
	m := NewLagMeter(root)
	m.now = func() time.Time { return now }
	committed := now.Add(-7 * time.Second)

	// app.log: committed to 60 when it held 60; it holds 100 now.
	// waiting.log: never committed, no lane. old.log: renamed to
	// old.log.1 since it was found, committed to its end.
	app := tailSplit(t, root, "a", "app.log", tailProgress(t, 60, tailState{Size: 60}), "w1", committed)
	waiting := tailSplit(t, root, "b", "waiting.log", nil, "", time.Time{})
	old := tailSplit(t, root, "c", "old.log", tailProgress(t, 10, tailState{Size: 10, Name: "old.log.1"}), "w2", committed)
	require.NoError(t, os.Rename(filepath.Join(root, "old.log"), filepath.Join(root, "old.log.1")))
	write("old.log", 5) // a new file at the old name: not this split's

	lags := m.Measure([]spate.SplitState{app, waiting, old})
	require.Len(t, lags, 3)
	byName := map[string]FileLag{}
	for _, l := range lags {
		byName[l.Name] = l
	}
	a := byName["app.log"]
	assert.True(t, a.Seen)
	assert.Equal(t, int64(40), a.Bytes, "the file's size now less its committed offset")
	assert.Equal(t, 7*time.Second, a.Age, "nothing was behind at the commit: the oldest unread byte is younger than it")
	assert.False(t, a.Waiting)

	w := byName["waiting.log"]
	assert.Equal(t, int64(30), w.Bytes, "a file waiting for a lane counts whole")
	assert.True(t, w.Waiting)
	assert.Positive(t, w.Age, "its first byte is as old as the file")

	o, ok := byName["old.log.1"]
	require.True(t, ok, "a renamed file is shown at its current name: %+v", lags)
	assert.Equal(t, "old.log", o.Found)
	assert.Equal(t, int64(0), o.Bytes)
	assert.Zero(t, o.Age)

	// app.log caught up, then grows again: its age counts from the last
	// look that saw it caught up, not from its last commit.
	now = now.Add(3 * time.Second)
	app = tailSplit(t, root, "a", "app.log", tailProgress(t, 100, tailState{Size: 100}), "w1", now)
	lags = m.Measure([]spate.SplitState{app})
	require.Len(t, lags, 1)
	assert.Zero(t, lags[0].Bytes)
	assert.Zero(t, lags[0].Age)
	now = now.Add(2 * time.Second)
	write("app.log", 8)
	lags = m.Measure([]spate.SplitState{app})
	assert.Equal(t, int64(8), lags[0].Bytes)
	assert.Equal(t, 2*time.Second, lags[0].Age)

	// A completed split is not measured, and is forgotten.
	app.Status = spate.StatusCompleted
	assert.Empty(t, m.Measure([]spate.SplitState{app}))
	assert.Empty(t, m.caughtUp)
}

// A file written all the time is never seen with nothing behind its
// commits, but each commit passes what an earlier look saw: the age of
// its oldest unread byte is bounded by that look, and stays about a
// sample (one second here) while the commits keep up, instead of growing
// from the file's first byte for as long as the writer writes.
func TestLagMeterAgeOfAFileWrittenAllTheTime(t *testing.T) {
	root := t.TempDir()
	f, err := os.OpenFile(filepath.Join(root, "app.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer f.Close()
	now := time.Now().Add(time.Minute)
	m := NewLagMeter(root)
	m.now = func() time.Time { return now }
	var committed int64
	for i := range 30 {
		_, err := f.Write(make([]byte, 100)) // 100 bytes a second
		require.NoError(t, err)
		sp := tailSplit(t, root, "a", "app.log", tailProgress(t, committed, tailState{Size: committed + 100}), "w1", now)
		lags := m.Measure([]spate.SplitState{sp})
		require.Len(t, lags, 1)
		assert.Equal(t, int64(100), lags[0].Bytes)
		if i > 0 {
			assert.Equal(t, time.Second, lags[0].Age, "look %d: the commit reached what the look a second ago saw", i)
		}
		committed += 100 // the commit a second later reaches what this look saw
		now = now.Add(time.Second)
	}
	assert.LessOrEqual(t, len(m.caughtUp["a"].looks), 2, "looks kept past the committed offset")

	// The commits stop: the age grows from the last look they passed.
	for range 5 {
		_, err := f.Write(make([]byte, 100))
		require.NoError(t, err)
		sp := tailSplit(t, root, "a", "app.log", tailProgress(t, committed, tailState{Size: committed}), "w1", now)
		lags := m.Measure([]spate.SplitState{sp})
		require.Len(t, lags, 1)
		now = now.Add(time.Second)
	}
	sp := tailSplit(t, root, "a", "app.log", tailProgress(t, committed, tailState{Size: committed}), "w1", now)
	assert.Equal(t, 6*time.Second, m.Measure([]spate.SplitState{sp})[0].Age)
}

func TestFollowedOfReadsTheRecords(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "x.log"), []byte("a\n"), 0o644))
	sp := tailSplit(t, root, "a", "x.log", tailProgress(t, 12, tailState{Base: 10, Size: 2, Name: "x.log.1", End: endDeleted}), "", time.Time{})
	f, ok := FollowedOf(sp.Descriptor, sp.Progress)
	require.True(t, ok)
	assert.Equal(t, "x.log", f.Found)
	assert.Equal(t, "x.log.1", f.Name)
	assert.Equal(t, int64(2), f.Committed)
	assert.Equal(t, int64(0), f.Lag)
	assert.Contains(t, EndReason(f.End), "deleted")
	_, ok = FollowedOf([]byte(`{"v":1,"files":[{"name":"a","size":1}]}`), nil)
	assert.False(t, ok, "a bounded split follows no file")
}
