package spate

import (
	"context"
	"errors"
	"testing"
	"time"

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
		t.Fatal(what)
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
	assert.Equal(t, rev2, a.splits["s"].progRev, "the loop folds the commits' reports into the view")
	assert.Equal(t, int64(11), *a.splits["s"].prog.Watermark)
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
		case <-a.results.sig:
			require.NoError(t, a.runResults())
		case <-time.After(10 * time.Second):
			t.Fatal("the failure report was never answered")
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
		t.Fatal("the commit neither wrote nor reached the loop")
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
			assert.NotContains(t, a.owned, "s")
			return
		case <-a.results.sig:
			require.NoError(t, a.runResults())
		case <-time.After(10 * time.Second):
			t.Fatal("the lost commit was never answered")
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
			case <-a.results.sig:
				require.NoError(t, a.runResults())
			case <-time.After(10 * time.Second):
				t.Fatal("the commit was never answered")
			}
		}
	}
	err := answer(NewSplitProgress(10, nil))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrRetryable), "%v", err)
	require.NoError(t, answer(NewSplitProgress(12, nil)), "the landed write is this tenancy's own: retry on top of it")
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, int64(12), *r.Watermark)
	assert.Contains(t, a.owned, "s")
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
		case <-a.results.sig:
			if lerr := a.runResults(); lerr != nil {
				require.True(t, IsFatal(lerr), "%v", lerr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the commit was never answered")
		}
	}
	require.Error(t, err)
	require.True(t, IsFatal(err), "a regression is Fatal: %v", err)
	err = a.c.Commit(context.Background(), MustSplitID("s"), NewSplitProgress(95, nil))
	require.Error(t, err, "a commit after a Fatal one must not land")
	assert.True(t, IsFatal(err), "%v", err)
}
