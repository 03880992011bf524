package spate

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rewatchFires reports whether the rewatch timer fires within the longest
// jittered re-watch delay.
func rewatchFires(a *actor) bool {
	select {
	case <-a.w.rewatch.C:
		return true
	case <-time.After(rewatchDelay + a.c.tm.rewatchJitter + time.Millisecond):
		return false
	}
}

// openTestWatch puts w in the state a fresh (re-)establishment leaves it:
// collecting its snapshot, which started at the returned mark.
func openTestWatch(a *actor, w *watchState) (cancelled *bool) {
	c := false
	w.ch, w.cancel, w.collecting, w.snapshot = make(chan WatchEvent), func() { c = true }, true, nil
	w.since = a.job.mark()
	w.deadline = time.Now().Add(a.c.tm.snapshotBudget)
	return &c
}

// A snapshot is collected, not applied piecemeal; at SnapshotDone it is
// applied as one complete read that started when the watch was opened.
func TestWatchSnapshotIsAppliedWhole(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	require.NoError(t, a.ephemeralPut(prefixWorker+"stale", workerBytes("n", 1), 1))
	w := a.w.streams[0]
	openTestWatch(a, w)
	require.NoError(t, a.onWatch(w, WatchEvent{Kind: WatchPut, Key: prefixWorker + "p", Value: workerBytes("n", 1), Revision: 5}, true))
	require.NoError(t, a.onWatch(w, WatchEvent{Kind: WatchDelete, Key: prefixWorker + "q", Revision: 6}, true))
	assert.NotContains(t, a.members.presence, "p", "nothing is applied before SnapshotDone")
	assert.Contains(t, a.members.presence, "stale")
	require.NoError(t, a.onWatch(w, WatchEvent{Kind: WatchSnapshotDone}, true))
	assert.False(t, w.collecting)
	assert.Nil(t, w.snapshot)
	assert.Contains(t, a.members.presence, "p")
	assert.NotContains(t, a.members.presence, "stale", "the snapshot is authoritative for what predates it")

	// A durable snapshot applies without deleting assignments (a watch
	// snapshot is not the reconcile listing).
	d := a.w.streams[1]
	a.setAssign("peer", &assignmentVal{Schema: SchemaVersion, Splits: []string{}}, 1)
	openTestWatch(a, d)
	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchPut, Key: prefixSplit + "s", Value: encode(rec("s", 0, "")), Revision: 9}, true))
	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchSnapshotDone}, true))
	assert.Equal(t, 1, a.job.nSplits)
	assert.Contains(t, a.assigns.byInst, "peer")
}

// After the snapshot, events apply one by one.
func TestWatchLiveEvents(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	e, d := a.w.streams[0], a.w.streams[1]
	require.NoError(t, a.onWatch(e, WatchEvent{Kind: WatchPut, Key: prefixWorker + "p", Value: workerBytes("n", 3), Revision: 2}, true))
	assert.Equal(t, 3, a.members.caps["p"])
	require.NoError(t, a.onWatch(e, WatchEvent{Kind: WatchDelete, Key: prefixWorker + "p", Revision: 3}, true))
	assert.NotContains(t, a.members.presence, "p")
	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchPut, Key: prefixSplit + "s", Value: encode(rec("s", 0, "")), Revision: 4}, true))
	assert.Equal(t, uint64(4), a.job.splits["s"].progRev)
	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchPut, Key: prefixAssign + "me", Value: encode(&assignmentVal{Schema: SchemaVersion, Splits: []string{"s"}}), Revision: 5}, true))
	assert.True(t, a.worker.assigned["s"])
	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchDelete, Key: prefixAssign + "me", Revision: 6}, true))
	assert.False(t, a.worker.assignSeen, "our assignment deleted: no instruction")

	require.NoError(t, a.onWatch(d, WatchEvent{Kind: WatchPut, Key: prefixSplit + "s", Value: []byte("garbage"), Revision: 7}, true),
		"an unreadable record through the watch does not stop the loop")
	assert.Contains(t, a.records.damaged, prefixSplit+"s", "it takes its own split out of play")
}

func TestWatchBreaks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		w := a.w.streams[0]

		cancelled := openTestWatch(a, w)
		require.NoError(t, a.onWatch(w, WatchEvent{Kind: WatchError, Err: Retryablef("compacted")}, true))
		assert.Nil(t, w.ch)
		assert.False(t, w.collecting)
		assert.True(t, *cancelled)
		assert.True(t, rewatchFires(a), "a transient break re-watches after rewatchDelay")

		cancelled = openTestWatch(a, w)
		require.NoError(t, a.onWatch(w, WatchEvent{}, false))
		assert.Nil(t, w.ch)
		assert.True(t, *cancelled)
		assert.True(t, rewatchFires(a), "a closed stream re-watches")

		openTestWatch(a, w)
		err := a.onWatch(w, WatchEvent{Kind: WatchError, Err: Fatalf("permission revoked")}, true)
		require.Error(t, err)
		assert.True(t, IsFatal(err))
		assert.ErrorContains(t, err, "watch ephemeral")
	})
}

// A snapshot that does not complete within its budget is given up and the
// watch opened again.
func TestExpireSnapshots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		w := a.w.streams[1]
		cancelled := openTestWatch(a, w)
		a.w.expireSnapshots(w.deadline, a.log, a.c.tm.snapshotBudget)
		assert.NotNil(t, w.ch, "at the deadline it is still in time")
		a.w.expireSnapshots(w.deadline.Add(time.Nanosecond), a.log, a.c.tm.snapshotBudget)
		assert.Nil(t, w.ch)
		assert.True(t, *cancelled)
		assert.True(t, rewatchFires(a))

		// A key group's snapshot has its own deadline; a loaded group
		// has none left.
		now := time.Now()
		late := &keyGroup{ks: Durable, keys: []string{"k1"}, collecting: true, deadline: now, cancel: func() {}}
		done := &keyGroup{ks: Durable, keys: []string{"k2"}, loaded: true, deadline: now, cancel: func() {}}
		for _, g := range []*keyGroup{late, done} {
			a.w.groups[g] = struct{}{}
			a.w.covered[Durable-1][g.keys[0]]++
		}
		a.w.expireSnapshots(now, a.log, a.c.tm.snapshotBudget)
		assert.False(t, late.closed, "at the deadline it is still in time")
		a.w.expireSnapshots(now.Add(time.Nanosecond), a.log, a.c.tm.snapshotBudget)
		assert.True(t, late.closed)
		assert.NotContains(t, a.w.groups, late)
		assert.Contains(t, a.w.groups, done, "a group whose snapshot is in stays")
		assert.Equal(t, map[string]int{"k2": 1}, a.w.covered[Durable-1])
		assert.True(t, rewatchFires(a))
	})
}

func TestOpenWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.put(Ephemeral, prefixWorker+"peer", workerBytes("n", 2))
		a := newTestActor(t, st, testConfig())
		w := a.w.streams[0]
		a.openWatch(w)
		a.openWatch(w) // one establishment at a time
		settleIO(t, a)
		require.NotNil(t, w.ch)
		assert.True(t, w.collecting)
		assert.Equal(t, 1, st.count("watch", ""))
		for w.collecting {
			ev, ok := <-w.ch
			require.NoError(t, a.onWatch(w, ev, ok))
		}
		assert.Contains(t, a.members.presence, "peer")

		// A failed re-watch is retried later; a Fatal one stops the loop.
		d := a.w.streams[1]
		st.setFault(func(c fakeCall) fakeFault {
			if c.op == "watch" {
				return fakeFault{err: Retryablef("unreachable")}
			}
			return fakeFault{}
		})
		a.openWatch(d)
		settleIO(t, a)
		assert.Nil(t, d.ch)
		assert.False(t, d.opening)
		assert.True(t, rewatchFires(a))

		st.setFault(func(c fakeCall) fakeFault { return fakeFault{err: Fatalf("forbidden")} })
		a.openWatch(d)
		synctest.Wait()
		<-a.io.results.sig
		err := a.io.runResults()
		assert.True(t, IsFatal(err), "%v", err)
	})
}

// The listing backstop applies both keyspaces as complete reads and is one
// at a time.
func TestReconcile(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	require.NoError(t, a.ephemeralPut(prefixWorker+"ghost", workerBytes("n", 1), 1)) // a missed delete
	a.setAssign("ghost", &assignmentVal{Schema: SchemaVersion, Splits: []string{}}, 1)
	st.put(Ephemeral, prefixWorker+"peer", workerBytes("n", 1))
	st.put(Durable, prefixSplit+"s", encode(rec("s", 0, "")))

	a.reconcile()
	a.reconcile() // folded into the one in flight
	assert.True(t, a.w.reconciling)
	settleIO(t, a)
	assert.False(t, a.w.reconciling)
	assert.Equal(t, 2, st.count("list", ""), "one listing per keyspace")
	assert.NotContains(t, a.members.presence, "ghost")
	assert.Contains(t, a.members.presence, "peer")
	assert.NotContains(t, a.assigns.byInst, "ghost")
	assert.Equal(t, 1, a.job.nSplits)
	assert.True(t, a.dirty)

	// A failed listing is logged and applies nothing.
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "list" && c.ks == Ephemeral {
			return fakeFault{err: Retryablef("down")}
		}
		return fakeFault{}
	})
	a.reconcile()
	settleIO(t, a)
	assert.Contains(t, a.members.presence, "peer", "a failed listing deletes nothing")
}

func TestKeyGroupsCountTheKeysTheyCoverAndHaveLoaded(t *testing.T) {
	ws := watchSet{keyScope: newKeyScope()}
	cancelled := 0
	add := func(keys ...string) *keyGroup {
		g := &keyGroup{ks: Durable, keys: keys, cancel: func() { cancelled++ }}
		ws.groups[g] = struct{}{}
		for _, k := range keys {
			ws.covered[Durable-1][k]++
		}
		return g
	}
	g1, g2 := add("a", "b"), add("b", "c")
	ws.markLoaded(g1)
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, ws.loaded[Durable-1])
	ws.markLoaded(g2)
	assert.Equal(t, map[string]int{"a": 1, "b": 2, "c": 1}, ws.loaded[Durable-1])

	ws.dropGroup(g1)
	assert.Equal(t, map[string]int{"b": 1, "c": 1}, ws.covered[Durable-1], "a key two groups watch stays covered by the other")
	assert.Equal(t, map[string]int{"b": 1, "c": 1}, ws.loaded[Durable-1])
	assert.Equal(t, 1, cancelled)
	ws.dropGroup(g1)
	assert.Equal(t, 1, cancelled, "dropping a group twice is a no-op")

	ws.closeGroups()
	assert.Empty(t, ws.groups)
	assert.Empty(t, ws.covered[Durable-1])
	assert.Empty(t, ws.loaded[Durable-1])
	assert.Empty(t, ws.covered[Ephemeral-1], "the other keyspace was never touched")
	assert.Equal(t, 2, cancelled)
}

// A scoped worker's view holds a split once both the group watching its
// lease and the one watching its progress record have their snapshots in.
func TestViewLoadedNeedsBothKeyspaces(t *testing.T) {
	ws := watchSet{keyScope: newKeyScope()}
	assert.False(t, ws.viewLoaded("s1"))
	ws.markLoaded(&keyGroup{ks: Durable, keys: []string{prefixSplit + "s1"}})
	assert.False(t, ws.viewLoaded("s1"), "the lease's group is not in yet")
	ws.markLoaded(&keyGroup{ks: Ephemeral, keys: []string{prefixSplit + "s1"}})
	assert.True(t, ws.viewLoaded("s1"))
	assert.False(t, ws.viewLoaded("s2"))
	ws.fullView = true
	assert.True(t, ws.viewLoaded("s2"), "the whole-job view holds every split")
}
