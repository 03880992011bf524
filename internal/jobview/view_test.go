package jobview

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// A member's line shows the age of the last heartbeat the view saw; one
// read only in the view's first snapshot says how long none has been
// seen; a beat read again in a snapshot after a broken watch does not
// pass for a new one; a member that parts has no line to age.
func TestMembersShowTheirLastHeartbeat(t *testing.T) {
	h := emptyHub("job", slog.New(slog.DiscardHandler))
	t0 := time.Unix(1_000_000, 0)
	now := t0
	h.now = func() time.Time { return now }
	js := &spate.JobState{Members: []spate.MemberState{{Instance: "w1"}, {Instance: "w2"}, {Instance: "w3"}}}
	beats := func() map[string]string {
		out := map[string]string{}
		for _, m := range membersOf(js, "w1", h.beats, now, func(func(row) bool) {}) {
			out[m.Instance] = m.Beat
		}
		return out
	}

	h.beat("w1", true, false) // both read in the first snapshot
	h.beat("w2", true, false)
	now = t0.Add(1500 * time.Millisecond)
	h.beat("w1", true, true)  // w1 beats, live
	h.beat("w2", true, false) // w2 only read again after a broken watch
	now = t0.Add(2 * time.Second)
	assert.Equal(t, map[string]string{"w1": "<1s", "w2": ">2s", "w3": ""}, beats())

	now = t0.Add(75 * time.Second) // w1 stalled since its beat
	assert.Equal(t, map[string]string{"w1": "1m13s", "w2": ">1m15s", "w3": ""}, beats())

	h.beat("w1", true, true)
	assert.Equal(t, "<1s", beats()["w1"])
	h.beat("w1", false, true) // parted
	assert.Empty(t, beats()["w1"])
	assert.NotContains(t, h.beats, "w1")
}

// A server started for one job reads it before any page asks; a job the
// opener cannot open is an error, and no view of it is kept.
func TestFollowReadsTheJobAhead(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	s := New(Config{Opener: benchOpener{store}, Store: "mem://", Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Follow(t.Context(), "bench"))
	s.mu.Lock()
	h := s.hubs["bench"]
	s.mu.Unlock()
	require.NotNil(t, h, "Follow kept no view of the job")
	select {
	case <-h.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the followed job was not read ahead of any page")
	}
	err := s.Follow(t.Context(), "bad/name")
	require.Error(t, err)
	assert.NotContains(t, s.hubs, "bad/name")
}

// A followed file's row (spate backfill --follow) is sized by what its
// last commit saw of the file: bytes left are its lag, not its size when
// it was found less the watermark.
func TestAFollowedFilesRowShowsItsLag(t *testing.T) {
	now := time.Now()
	sp := spate.SplitState{ID: spate.MustSplitID("t1abc"), Status: spate.StatusRunnable, LeaseOwner: "w1", Owner: "w1",
		Weight: 10, HasSpec: true, Progress: &spate.SplitProgress{Watermark: 400, State: []byte(`{"size":1000}`)}}
	r := rowOf(sp, now, map[string]rate{})
	assert.Equal(t, int64(600), r.Left)
	assert.Equal(t, uint64(1000), r.Weight)
	assert.Equal(t, 40, r.Percent)
	assert.Equal(t, int64(400), r.done)

	sp.Status, sp.Progress = spate.StatusCompleted, &spate.SplitProgress{Watermark: 1000, Completed: true, State: []byte(`{"size":1000}`)}
	r = rowOf(sp, now, map[string]rate{})
	assert.Equal(t, int64(0), r.Left)
	assert.Equal(t, 100, r.Percent)
}

// A followed file's row names its file (now, and as found after a
// rename), its output file, and why it completed.
func TestAFollowedFilesRowNamesItsFile(t *testing.T) {
	desc := []byte(`{"v":1,"files":null,"tail":{"name":"app.log","dev":1,"ino":2}}`)
	sp := spate.SplitState{ID: spate.MustSplitID("t1"), Status: spate.StatusCompleted, Owner: "w1", Weight: 10, HasSpec: true, Descriptor: desc,
		Progress: &spate.SplitProgress{Watermark: 100, Completed: true, State: []byte(`{"size":100,"name":"app.log.1","end":"deleted"}`),
			Output: []byte(`{"v":1,"file":"t1.out","len":100,"crc":7}`)}}
	r := rowOf(sp, time.Now(), map[string]rate{})
	assert.Equal(t, "app.log.1", r.File)
	assert.Equal(t, "app.log", r.Found)
	assert.Equal(t, "t1.out", r.Output)
	assert.Contains(t, r.End, "deleted")

	// A file waiting for a lane, never committed: its bytes left are not
	// known from the records, not 0.
	sp = spate.SplitState{ID: spate.MustSplitID("t2"), Status: spate.StatusRunnable, Weight: 10, HasSpec: true, Descriptor: desc}
	r = rowOf(sp, time.Now(), map[string]rate{})
	assert.Equal(t, "app.log", r.File)
	assert.Equal(t, int64(-1), r.Left)
}

// A parked split (an idle followed file: held, but it takes no lane) is
// shown as parked, naming its file, not as a running lease: counted apart
// in the summary, still held by its member, listed after the live work
// and the files waiting for a lane, and not taken for a stall.
func TestAParkedSplitIsShownAsParked(t *testing.T) {
	desc := []byte(`{"v":1,"files":null,"tail":{"name":"app.log","dev":1,"ino":2}}`)
	sp := spate.SplitState{ID: spate.MustSplitID("t1"), Status: spate.StatusRunnable, LeaseOwner: "w1", Owner: "w1", Weight: 10, HasSpec: true, Descriptor: desc,
		Progress: &spate.SplitProgress{Watermark: 100, Parked: true, State: []byte(`{"size":100,"name":"app.log.1"}`)}}
	r := rowOf(sp, time.Now(), map[string]rate{})
	assert.Equal(t, "parked", r.State)
	assert.Equal(t, "app.log.1", r.File)
	assert.Equal(t, "app.log", r.Found)

	var s summary
	s.count(r, 1)
	assert.Equal(t, 1, s.Parked)
	assert.Zero(t, s.Leased, "a parked split counted as a running lease")
	assert.Zero(t, s.Runnable, "a parked split counted as waiting for a lane")
	assert.Equal(t, "running", s.finished(true).State, "a job whose only live split is parked is not stalled")

	meta := &spate.JobState{Members: []spate.MemberState{{Instance: "w1", MaxInFlight: 2}}}
	ms := membersOf(meta, "w1", nil, time.Now(), func(yield func(row) bool) { yield(r) })
	require.Len(t, ms, 1)
	assert.Equal(t, 1, ms[0].Held, "the parked split is still its member's")

	rs := []row{{ID: "a", State: "parked"}, {ID: "b", State: "completed"}, {ID: "c", State: "runnable"}, {ID: "d", State: "leased"}}
	sortRows(rs, "")
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	assert.Equal(t, []string{"d", "c", "a", "b"}, ids)
}

// A split's rate follows its commits and falls to 0 within a window once
// its file stops growing, though the row is redone while nothing changes.
func TestARateDecaysWhenAFileStops(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	rates := map[string]rate{}
	sp := spate.SplitState{ID: spate.MustSplitID("t1"), Status: spate.StatusRunnable, LeaseOwner: "w1", Owner: "w1", Weight: 10, HasSpec: true,
		Progress: &spate.SplitProgress{Watermark: 0, State: []byte(`{"size":0}`)}}
	var r row
	// 1000 B committed each second, the row read every 250 ms.
	for i := range 80 {
		now := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		sp.Progress = &spate.SplitProgress{Watermark: int64(i/4) * 1000, State: []byte(`{"size":1}`)}
		r = rowOf(sp, now, rates)
	}
	assert.InDelta(t, 1000, r.Rate, 150, "the commits' pace")
	stopped := t0.Add(20 * time.Second)
	for i := range 15 { // the leased rows are redone every 2 s
		r = rowOf(sp, stopped.Add(time.Duration(i)*2*time.Second), rates)
	}
	assert.Zero(t, r.Rate, "30 s after the file stopped")
}

// An open plan is a continuous job: the page names its state as the CLI
// does, and lists live work before completed work.
func TestAnOpenPlanIsFollowingAndLiveRowsComeFirst(t *testing.T) {
	assert.Equal(t, "following", summary{Splits: 2, Leased: 1, Completed: 1}.finished(false).State)
	rs := []row{{ID: "a", State: "completed"}, {ID: "b", State: "leased"}, {ID: "c", State: "runnable"}, {ID: "d", State: "leased"}}
	sortRows(rs, "")
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	assert.Equal(t, []string{"b", "d", "c", "a"}, ids)
}

// A split handed back (its durable owner cleared: a rebalance's drained
// release, a graceful stop) is "released" on the timeline, not "lost";
// a lease that ended with its owner still recorded is a loss.
func TestAHandBackIsNotALoss(t *testing.T) {
	now := time.Now()
	held := row{ID: "a", State: "leased", Lease: "w1", Owner: "w1", Epoch: 3}
	handed := row{ID: "a", State: "runnable", Epoch: 3}
	died := row{ID: "a", State: "runnable", Owner: "w1", Epoch: 3}
	require.Len(t, transitions(held, handed, now), 1)
	assert.Equal(t, "released", transitions(held, handed, now)[0].Kind)
	assert.Equal(t, "lost", transitions(held, died, now)[0].Kind)
}

// ETAs are rounded as an operator reads them: a split about to finish
// shows "<1s", not "312ms"; the job's shows minutes and padded seconds.
func TestETAsAreHumanRounded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	rates := map[string]rate{}
	sp := spate.SplitState{ID: spate.MustSplitID("t1"), Status: spate.StatusRunnable, LeaseOwner: "w1", Owner: "w1", Weight: 10_000, HasSpec: true,
		Progress: &spate.SplitProgress{Watermark: 0}}
	rowOf(sp, t0, rates)
	// 9,688 B in 3 s: 3,229 B/s, 312 B left, due in ~97 ms.
	sp.Progress = &spate.SplitProgress{Watermark: 9_688}
	r := rowOf(sp, t0.Add(3*time.Second), rates)
	require.Equal(t, int64(312), r.Left)
	require.Positive(t, r.Rate)
	assert.Equal(t, "<1s", r.ETA)

	// 1 MiB/s with 185.4 MiB left: 3m05s.
	s := summary{Splits: 1, Leased: 1, Rate: 1 << 20, BytesTotal: 200 << 20, BytesDone: 200<<20 - 1854<<20/10}
	assert.Equal(t, "3m05s", s.finished(true).ETA)
}
