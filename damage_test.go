package spate

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnreadableRecordTakesOnlyItsSplitOutOfPlay(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "bad", 2, nil)
	holdSplit(t, a, st, "good", 2, nil)
	require.Equal(t, 2, a.job.nSplits)

	rev := st.put(Durable, prefixSplit+"bad", []byte(`{"not":"ours"}`))
	require.NoError(t, a.durablePut(prefixSplit+"bad", []byte(`{"not":"ours"}`), rev, live),
		"one unreadable record does not stop the worker")

	assert.Equal(t, []string{"bad"}, lostSplits(events(t, a)), "its tenancy is lost")
	assert.NotContains(t, a.worker.owned, "bad")
	assert.Contains(t, a.worker.owned, "good", "every other split keeps running")
	assert.Equal(t, []string{"bad"}, a.records.damagedSplits())
	assert.Equal(t, 1, a.job.nSplits, "a damaged split is not counted as in play")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.damaged))
	for _, in := range a.claimInputs() {
		assert.NotEqual(t, "bad", in.id, "a damaged split is never claimed")
	}
	d := a.records.damaged[prefixSplit+"bad"]
	require.NotNil(t, d)
	assert.True(t, errors.Is(d.err, ErrUnreadableRecord))
	assert.Contains(t, d.err.Error(), prefixSplit+"bad", "the cause names the key")

	// The same damage seen again (a listing, a re-watch) is not news.
	require.NoError(t, a.applyDurable([]Entry{{Key: prefixSplit + "bad", Value: []byte(`{"not":"ours"}`), Revision: rev}}, a.job.mark(), false))
	assert.Len(t, a.records.damaged, 1)

	// A commit on the damaged split is fenced; one on the good split lands.
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("bad"), progress: NewSplitProgress(1, nil)})
	assert.True(t, errors.Is(err, ErrFenced), "%v", err)
	require.NoError(t, a.c.Commit(context.Background(), MustSplitID("good"), NewSplitProgress(1, nil)))
}

func TestRewrittenRecordPutsItsSplitBackInPlay(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	rev := st.put(Durable, prefixSplit+"s", []byte("garbage"))
	require.NoError(t, a.durablePut(prefixSplit+"s", []byte("garbage"), rev, live))
	require.Len(t, a.records.damaged, 1)

	good := rec("s", 3, "")
	rev = st.put(Durable, prefixSplit+"s", encode(good))
	require.NoError(t, a.durablePut(prefixSplit+"s", encode(good), rev, live))
	assert.Empty(t, a.records.damaged)
	assert.Equal(t, 1, a.job.nSplits)
	assert.Equal(t, uint64(3), a.job.splits["s"].prog.Epoch)
	assert.Equal(t, 0.0, testutil.ToFloat64(a.m.damaged))
}

// Deleting a damaged progress record (the fix the log names) hands the
// split to the leader's restore, from the last state the view held.
func TestDeletedDamagedRecordIsRestoredFromTheLastStateSeen(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	r := rec("s", 2, "me")
	r.Watermark = wm(40)
	holdSplit(t, a, st, "s", 2, r)
	rev := st.put(Durable, prefixSplit+"s", []byte("garbage"))
	require.NoError(t, a.durablePut(prefixSplit+"s", []byte("garbage"), rev, live))

	st.remove(Durable, prefixSplit+"s")
	a.durableDelete(prefixSplit+"s", 0)
	assert.Empty(t, a.records.damaged)
	require.Contains(t, a.records.missing, "s")
	assert.Equal(t, int64(40), *a.records.missing["s"].Watermark, "restored from the last readable state")
}

// A damaged record that a listing no longer shows was deleted while the
// watch was away: the split is back in play.
func TestListingWithoutTheDamagedRecordRepairsIt(t *testing.T) {
	a := newTestActor(t, newFakeStore(), testConfig())
	require.NoError(t, a.durablePut(prefixSpec+"s", []byte("garbage"), 3, live))
	require.Equal(t, []string{"s"}, a.records.damagedSplits())
	require.NoError(t, a.applyDurable(nil, a.job.mark(), true))
	assert.Empty(t, a.records.damaged)
}

func TestJobWithADamagedSplitEndsStalledNamingIt(t *testing.T) {
	a, st := completeView(t, 2)
	a.planning.plan.Planned = 3
	rev := st.put(Durable, prefixSplit+"c", []byte("garbage"))
	require.NoError(t, a.durablePut(prefixSplit+"c", []byte("garbage"), rev, live))
	a.detectTerminal()
	settleIO(t, a)
	assert.True(t, a.verdicts.terminal)
	assert.Equal(t, []Event{Stalled{Completed: 2, Damaged: []string{"c"}}}, events(t, a))
}

// A runnable split whose spec cannot be read can never be claimed: it
// blocks completion like a damaged progress record.
func TestJobWithADamagedSpecEndsStalled(t *testing.T) {
	a, st := completeView(t, 2)
	a.planning.plan.Planned = 3
	r := rec("c", 0, "")
	a.upsert("c", r, st.put(Durable, prefixSplit+"c", encode(r)), live)
	require.NoError(t, a.durablePut(prefixSpec+"c", []byte("garbage"), st.put(Durable, prefixSpec+"c", []byte("garbage")), live))
	a.detectTerminal()
	settleIO(t, a)
	assert.Equal(t, []Event{Stalled{Completed: 2, Damaged: []string{"c"}}}, events(t, a))
}

func TestInspectShowsADamagedJobInsteadOfRefusingIt(t *testing.T) {
	st := newFakeStore()
	plan := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 2}
	st.put(Durable, keyPlan, encode(plan))
	st.put(Durable, prefixSplit+"a", encode(rec("a", 1, "")))
	st.put(Durable, prefixSplit+"b", []byte(`{"schema":1,"id":"b","fp":7}`))

	js, err := InspectJob(context.Background(), st, testFP)
	require.NoError(t, err)
	require.Len(t, js.Splits, 2)
	a, _ := js.Split("a")
	assert.Equal(t, StatusRunnable, a.Status)
	assert.NoError(t, a.Damage)
	b, _ := js.Split("b")
	assert.Equal(t, StatusDamaged, b.Status)
	require.Error(t, b.Damage)
	assert.True(t, errors.Is(b.Damage, ErrUnreadableRecord))
	assert.Contains(t, b.Damage.Error(), prefixSplit+"b")
	assert.Contains(t, b.DamageFix, "delete the key")
	assert.Contains(t, b.String(), "damaged")
}

// A job whose plan record vanished under a running worker (a wiped store,
// a restart without persistence) stops with the likely causes, not as
// "tampered with".
func TestVanishedPlanStopsTheWorkerNamingLikelyCauses(t *testing.T) {
	a := newTestActor(t, newFakeStore(), testConfig())
	a.setPlan(&planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 1}, 3)

	err := a.onWatch(a.w.streams[1], WatchEvent{Kind: WatchDelete, Key: keyPlan, Revision: 9}, true)
	require.Error(t, err)
	assert.True(t, IsFatal(err))
	for _, want := range []string{"gone from the store", "FLUSHALL", "without persistence", "backup"} {
		assert.Contains(t, err.Error(), want)
	}

	// A whole-keyspace listing, started after the plan was seen, without it.
	err = a.applyDurable([]Entry{{Key: prefixSplit + "s", Value: encode(rec("s", 0, "")), Revision: 10}}, a.job.mark(), true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has no plan record")

	// A listing that started before the plan arrived proves nothing.
	b := newTestActor(t, newFakeStore(), testConfig())
	mark := b.job.mark()
	b.setPlan(&planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 1}, 3)
	require.NoError(t, b.applyDurable(nil, mark, true))
}

func TestRecordStateNamesEachDamagedSplitOnce(t *testing.T) {
	r := recordState{damaged: map[string]*damagedRecord{}, missing: map[string]*progressRecord{}}
	assert.False(t, r.splitDamaged("s"))
	assert.Empty(t, r.damagedSplits())

	r.damaged[prefixSplit+"s"] = &damagedRecord{id: "s"}
	r.damaged[prefixSpec+"s"] = &damagedRecord{id: "s"}
	r.damaged[prefixSpec+"a"] = &damagedRecord{id: "a"}

	assert.True(t, r.splitDamaged("s"))
	assert.True(t, r.splitDamaged("a"), "a damaged spec takes its split out of play")
	assert.False(t, r.splitDamaged("b"))
	assert.Equal(t, []string{"a", "s"}, r.damagedSplits(), "sorted, each split once")
	assert.Equal(t, []string{prefixSpec + "a", prefixSpec + "s", prefixSplit + "s"}, r.damagedKeys())
}
