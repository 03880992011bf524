package spate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockUpdates makes the fake store hold every Update on split id until
// the returned release is called; entered receives once per held call.
func blockUpdates(st *fakeStore, id string) (entered chan struct{}, release func()) {
	entered = make(chan struct{}, 8)
	gate := make(chan struct{})
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update" && c.key == prefixSplit+id {
			entered <- struct{}{}
			<-gate
		}
		return fakeFault{}
	})
	return entered, func() { close(gate) }
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		require.FailNow(t, what)
	}
}

func TestCommitLandsOnTheCallersGoroutine(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)

	// Nothing runs the loop here: the commit can only return if it was
	// written and answered without a hand-off.
	require.NoError(t, a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(10, []byte("x"))))
	r, rev := storedProgress(t, st, "s")
	assert.Equal(t, int64(10), *r.Watermark)
	assert.Equal(t, uint64(3), r.Epoch)
	assert.Equal(t, uint64(3), r.AdvancedEpoch, "a commit that advances the watermark records the tenancy that did")
	assert.Empty(t, a.c.cmds, "the commit did not go through the loop")

	// The next commit fences on the revision the first one left, before the
	// loop has folded anything.
	require.NoError(t, a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(11, nil)))
	r, rev2 := storedProgress(t, st, "s")
	assert.Equal(t, int64(11), *r.Watermark)
	assert.Greater(t, rev2, rev)

	settleIO(t, a)
	assert.Equal(t, rev2, a.job.splits["s"].progRev, "the loop folds the commits' reports into the view")
	assert.Equal(t, int64(11), *a.job.splits["s"].prog.Watermark)
}

func TestCompletingOrRegressingCommitsTakeTheLoopsPath(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	r := rec("s", 3, "me")
	r.Watermark = wm(20)
	holdSplit(t, a, st, "s", 3, r)
	ctx := context.Background()

	done, _ := a.c.commitHere(ctx, MustSplitID("s"), 0, CompletedProgress(30, nil))
	assert.False(t, done, "a completing commit ends the tenancy: the loop writes it")
	done, _ = a.c.commitHere(ctx, MustSplitID("s"), 0, NewSplitProgress(19, nil))
	assert.False(t, done, "a watermark below the one seen needs the loop's re-read")
	done, _ = a.c.commitHere(ctx, MustSplitID("s"), 2, NewSplitProgress(21, nil))
	assert.False(t, done, "a commit for another tenancy is judged by the loop")
	done, _ = a.c.commitHere(ctx, MustSplitID("other"), 0, NewSplitProgress(21, nil))
	assert.False(t, done, "a split not held has no cell")
	assert.Equal(t, 0, st.count("update", prefixSplit), "none of them wrote")

	a.closeCells()
	done, _ = a.c.commitHere(ctx, MustSplitID("s"), 0, NewSplitProgress(21, nil))
	assert.False(t, done, "once the loop has exited no commit runs beside it")
}

// A write of the loop's on a split waits for the commit in flight on it,
// and then fences on the revision that commit left.
func TestLoopWriteWaitsForTheCommitInFlight(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	entered, release := blockUpdates(st, "s")

	committed := make(chan error, 1)
	go func() { committed <- a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(10, nil)) }()
	waitFor(t, entered, "the commit never reached the store")

	fail := &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison", reply: make(chan error, 1)}
	require.NoError(t, a.handle(fail))
	assert.Equal(t, 1, st.count("update", prefixSplit), "the failure report waits for the commit in flight")

	release()
	require.NoError(t, <-committed)
	for {
		select {
		case err := <-fail.reply:
			require.NoError(t, err, "the failure report fenced on the commit's revision and won")
			r, _ := storedProgress(t, st, "s")
			assert.Equal(t, int64(10), *r.Watermark, "the commit's watermark is kept")
			assert.Equal(t, uint32(1), r.Attempts)
			assert.Nil(t, r.Owner)
			return
		case <-a.io.results.sig:
			require.NoError(t, a.io.runResults())
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the failure report was never answered")
		}
	}
}

// A commit that finds the cell reserved by the loop goes through the loop
// and is ordered after the loop's write.
func TestCommitWaitsForTheLoopsWrite(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	entered, release := blockUpdates(st, "s")

	fail := &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison", reply: make(chan error, 1)}
	require.NoError(t, a.handle(fail))
	waitFor(t, entered, "the failure report never reached the store")

	committed := make(chan error, 1)
	go func() { committed <- a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(10, nil)) }()
	var cmd *command
	select {
	case cmd = <-a.c.cmds:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the commit neither wrote nor reached the loop")
	}
	assert.Equal(t, 1, st.count("update", prefixSplit), "the commit did not write beside the loop's write")
	require.NoError(t, a.handle(cmd))

	release()
	settleIO(t, a)
	require.NoError(t, <-fail.reply)
	err := <-committed
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrFenced), "after the failure report the split is no longer held: %v", err)
}

func TestLostCommitOnTheCallersGoroutineIsFencedAndLost(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	// A peer took the split over; the view has not seen it yet.
	st.put(Durable, prefixSplit+"s", encode(rec("s", 4, "peer")))

	committed := make(chan error, 1)
	go func() { committed <- a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(10, nil)) }()
	for {
		select {
		case err := <-committed:
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrFenced), "a lost commit is fenced: %v", err)
			r, _ := storedProgress(t, st, "s")
			assert.Equal(t, "peer", r.owner(), "nothing of the fenced commit was written")
			assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
			assert.NotContains(t, a.worker.owned, "s")
			return
		case <-a.io.results.sig:
			require.NoError(t, a.io.runResults())
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the lost commit was never answered")
		}
	}
}

// A commit whose reply was lost (it landed, the answer did not arrive) is
// adopted by the next one through the loop's verdict, not fenced.
func TestCommitAfterALostReplyIsNotFenced(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	first := true
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update" && first {
			first = false
			return fakeFault{err: Retryablef("fake: connection reset"), landed: true}
		}
		return fakeFault{}
	})
	ctx := context.Background()
	answer := func(p SplitProgress) error {
		committed := make(chan error, 1)
		go func() { committed <- a.c.Commit(ctx, MustSplitID("s"), p) }()
		for {
			select {
			case err := <-committed:
				return err
			case <-a.io.results.sig:
				require.NoError(t, a.io.runResults())
			case <-time.After(10 * time.Second):
				require.FailNow(t, "the commit was never answered")
			}
		}
	}
	err := answer(NewSplitProgress(10, nil))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrRetryable), "%v", err)
	require.NoError(t, answer(NewSplitProgress(12, nil)), "the landed write is this tenancy's own: retry on top of it")
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, int64(12), *r.Watermark)
	assert.Contains(t, a.worker.owned, "s")
}

// A Fatal commit is sticky before its caller hears of it: the next commit,
// which could take the fast path beside a loop about to stop, fails too.
func TestFatalCommitIsStickyBeforeItsReply(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	r := rec("s", 3, "me")
	r.Watermark = wm(50)
	holdSplit(t, a, st, "s", 3, r)
	// The store is further than the view (a lost reply landed): the
	// commit re-reads and finds a regression, which is Fatal.
	r2 := rec("s", 3, "me")
	r2.Watermark = wm(90)
	st.put(Durable, prefixSplit+"s", encode(r2))

	// The loop path, pumped by hand: the continuation returns the Fatal
	// error to the loop (which then stops) after replying.
	cmd := &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(60, nil), reply: make(chan error, 1)}
	require.NoError(t, a.handle(cmd))
	var err error
	for done := false; !done; {
		select {
		case err = <-cmd.reply:
			done = true
		case <-a.io.results.sig:
			if lerr := a.io.runResults(); lerr != nil {
				require.True(t, IsFatal(lerr), "%v", lerr)
			}
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the commit was never answered")
		}
	}
	require.Error(t, err)
	require.True(t, IsFatal(err), "a regression is Fatal: %v", err)
	err = a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(95, nil))
	require.Error(t, err, "a commit after a Fatal one must not land")
	assert.True(t, IsFatal(err), "%v", err)
}

func TestLostCommitVerdict(t *testing.T) {
	// cur builds the record the store holds after the lost CAS.
	cur := func(owner string, epoch uint64, status string, watermark *int64, completed bool) *progressRecord {
		r := rec("s", epoch, owner)
		r.Status, r.Watermark, r.Completed = status, watermark, completed
		return r
	}
	const self, epoch = "me", 5
	cases := []struct {
		name string
		cur  *progressRecord
		p    SplitProgress
		want commitVerdict
	}{
		{"record gone", nil, NewSplitProgress(3, nil), verdictFenced},
		{"another owner", cur("peer", epoch, statusRunnable, wm(3), false), NewSplitProgress(3, nil), verdictFenced},
		{"owner cleared (released)", cur("", epoch, statusRunnable, wm(3), false), NewSplitProgress(3, nil), verdictFenced},
		{"our instance id at another epoch (a later tenancy)", cur(self, epoch+1, statusRunnable, wm(3), false), NewSplitProgress(3, nil), verdictFenced},
		{"quarantined under us", cur(self, epoch, statusQuarant, wm(3), false), NewSplitProgress(3, nil), verdictFenced},
		{"exactly this commit landed", cur(self, epoch, statusRunnable, wm(7), false), NewSplitProgress(7, nil), verdictLanded},
		{"exactly this completing commit landed", cur(self, epoch, statusCompleted, wm(7), true), CompletedProgress(7, nil), verdictLanded},
		{"an earlier completing commit landed", cur(self, epoch, statusCompleted, wm(9), true), NewSplitProgress(7, nil), verdictLanded},
		{"an earlier completing commit landed, this one is further", cur(self, epoch, statusCompleted, wm(5), true), NewSplitProgress(7, nil), verdictLanded},
		{"the store is further: a regression", cur(self, epoch, statusRunnable, wm(9), false), NewSplitProgress(7, nil), verdictRegress},
		{"an earlier commit of ours landed below: retry on top", cur(self, epoch, statusRunnable, wm(5), false), NewSplitProgress(7, nil), verdictRetry},
		{"no watermark yet: retry on top", cur(self, epoch, statusRunnable, nil, false), NewSplitProgress(7, nil), verdictRetry},
		{"same watermark landed, this one completes it: retry", cur(self, epoch, statusRunnable, wm(7), false), CompletedProgress(7, nil), verdictRetry},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, lostCommitVerdict(c.cur, self, epoch, c.p))
		})
	}
}

// verdictLanded is documented as "exactly this commit ... landed". A commit
// at the committed watermark carrying different resume state is not this
// commit: adopting the stored record would tell the source its state is
// durable while the store holds the older state.
func TestLostCommitVerdictDoesNotAdoptDifferentState(t *testing.T) {
	cur := rec("s", 5, "me")
	cur.Watermark, cur.State = wm(7), []byte("offset=100")
	got := lostCommitVerdict(cur, "me", 5, NewSplitProgress(7, []byte("offset=250")))
	assert.NotEqual(t, verdictLanded, got,
		"a lost commit whose state differs from the stored record's was judged landed: the new state is acknowledged but never written")
	assert.Equal(t, verdictLanded, lostCommitVerdict(cur, "me", 5, NewSplitProgress(7, []byte("offset=100"))))
}

func TestCommitWritesTheRecordAtTheViewedRevision(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(10, []byte("x"))}))
	r, rev := storedProgress(t, st, "s")
	assert.Equal(t, int64(10), *r.Watermark)
	assert.Equal(t, []byte("x"), r.State)
	assert.Equal(t, uint64(3), r.Epoch, "a commit never changes the epoch")
	assert.Equal(t, rev, a.job.splits["s"].progRev, "the view folds the commit's own write")
	assert.Contains(t, a.worker.owned, "s")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.writes.WithLabelValues("ok")))
}

func TestCommitOnASplitNotHeldIsFencedAndWritesNothing(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(1, nil)})
	require.Error(t, err)
	assert.True(t, IsFenced(err), "got %v", err)
	assert.Zero(t, st.count("update", ""))

	holdSplit(t, a, st, "t", 4, nil)
	err = send(t, a, &command{kind: cmdCommit, split: MustSplitID("t"), epoch: 3, progress: NewSplitProgress(1, nil)})
	assert.True(t, IsFenced(err), "a commit for an ended tenancy (epoch 3, holding 4) is fenced: %v", err)
	assert.Zero(t, st.count("update", prefixSplit))
	assert.Empty(t, lostSplits(events(t, a)), "no Lost follows a commit on a split not held")
}

// A commit whose reply was lost (it landed) and whose source commits the
// same progress again adopts the landed write instead of losing the split.
func TestCommitAdoptsALandedCommitWhoseReplyWasLost(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	lost := 1
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update" && c.ks == Durable && lost > 0 {
			lost--
			return fakeFault{err: Retryablef("reply lost"), landed: true}
		}
		return fakeFault{}
	})
	p := NewSplitProgress(5, []byte("s5"))
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: p})
	require.True(t, IsRetryable(err), "the first commit reports the lost reply: %v", err)
	_, landedRev := storedProgress(t, st, "s")

	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: p}))
	r, rev := storedProgress(t, st, "s")
	assert.Equal(t, landedRev, rev, "the second commit wrote nothing: it adopted the landed one")
	assert.Equal(t, int64(5), *r.Watermark)
	assert.Contains(t, a.worker.owned, "s", "the split is still held")
	assert.Equal(t, landedRev, a.job.splits["s"].progRev)
	assert.Empty(t, lostSplits(events(t, a)))
}

// A commit that lost its CAS to an earlier commit of this tenancy that
// landed below it commits again on top.
func TestCommitRetriesOnTopOfAnEarlierLandedCommit(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	earlier := rec("s", 2, "me")
	earlier.Watermark = wm(5)
	st.put(Durable, prefixSplit+"s", encode(earlier)) // landed; the view never heard of it

	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(8, nil)}))
	r, rev := storedProgress(t, st, "s")
	assert.Equal(t, int64(8), *r.Watermark)
	assert.Equal(t, rev, a.job.splits["s"].progRev)
	assert.Contains(t, a.worker.owned, "s")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.writes.WithLabelValues("conflict")))
}

func TestCommitLostToAnotherOwnerIsFencedAndEmitsLost(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))

	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(8, nil)})
	assert.True(t, IsFenced(err), "got %v", err)
	assert.NotContains(t, a.worker.owned, "s")
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	assert.Zero(t, a.renew.leaseRev("s"), "the renewer stops renewing a lost split")
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, "peer", r.owner(), "nothing was written over the new owner")
}

// A commit below the watermark the view holds first re-reads the record:
// if the store confirms the higher watermark it is a source bug (Fatal);
// if the store went back in time, the view adopts what the store says and
// the commit goes through.
func TestCommitBelowTheViewedWatermark(t *testing.T) {
	t.Run("confirmed by the store: Fatal", func(t *testing.T) {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		r := rec("s", 2, "me")
		r.Watermark = wm(10)
		holdSplit(t, a, st, "s", 2, r)
		cmd := &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(4, nil), reply: make(chan error, 1)}
		require.NoError(t, a.handle(cmd))
		var loopErr error
		for loopErr == nil && len(cmd.reply) == 0 {
			<-a.io.results.sig
			loopErr = a.io.runResults()
		}
		require.Error(t, loopErr, "a regression stops the loop")
		assert.True(t, IsFatal(loopErr))
		assert.True(t, IsFatal(<-cmd.reply), "and the command is answered with it")
		assert.Zero(t, st.count("update", prefixSplit), "nothing was written")
	})
	t.Run("the store went back in time: adopt and commit", func(t *testing.T) {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		older := rec("s", 2, "me")
		older.Watermark = wm(3)
		olderRev := st.put(Durable, prefixSplit+"s", encode(older))
		r := rec("s", 2, "me")
		r.Watermark = wm(10)
		holdSplit(t, a, st, "s", 2, r) // the view saw watermark 10 at a later revision
		// The store lost the write of watermark 10: it holds the older record again.
		st.mu.Lock()
		st.data[Durable][prefixSplit+"s"] = Entry{Key: prefixSplit + "s", Value: encode(older), Revision: olderRev}
		st.mu.Unlock()

		require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(4, nil)}))
		got, rev := storedProgress(t, st, "s")
		assert.Equal(t, int64(4), *got.Watermark)
		assert.Equal(t, rev, a.job.splits["s"].progRev)
	})
}

func TestCompletingCommitLeavesTheSplit(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: CompletedProgress(9, nil)}))
	settleIO(t, a)
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, statusCompleted, r.Status)
	assert.True(t, r.Completed)
	assert.NotContains(t, a.worker.owned, "s")
	_, ok := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, ok, "the completed split's lease is deleted")
	assert.Equal(t, 1, a.job.nCompleted)
	assert.Empty(t, lostSplits(events(t, a)), "completing is no loss")
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: CompletedProgress(9, nil)})
	assert.True(t, IsFenced(err), "a commit after completion is fenced: %v", err)
}

// The same bug end to end: a commit at the committed watermark with new
// resume state, after an earlier commit's reply was lost, is acknowledged
// while the store keeps the earlier state.
func TestCommitOfNewStateAtTheSameWatermarkAfterALostReplyIsWritten(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	lost := 1
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update" && c.ks == Durable && lost > 0 {
			lost--
			return fakeFault{err: Retryablef("reply lost"), landed: true}
		}
		return fakeFault{}
	})
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(7, []byte("A"))})
	require.True(t, IsRetryable(err), "%v", err)
	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(7, []byte("B"))}))
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, []byte("B"), r.State, "the commit was acknowledged as durable, so its state must be what the store holds")
}

func TestNotHeldIsFenced(t *testing.T) {
	err := notHeld("s")
	assert.True(t, errors.Is(err, ErrFenced))
	assert.Contains(t, err.Error(), "split s")
}
