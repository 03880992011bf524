package spate

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ----- lostCommitVerdict ---------------------------------------------------------

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

// ----- commit on the loop ----------------------------------------------------------

func TestCommitWritesTheRecordAtTheViewedRevision(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	require.NoError(t, send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(10, []byte("x"))}))
	r, rev := storedProgress(t, st, "s")
	assert.Equal(t, int64(10), *r.Watermark)
	assert.Equal(t, []byte("x"), r.State)
	assert.Equal(t, uint64(3), r.Epoch, "a commit never changes the epoch")
	assert.Equal(t, rev, a.splits["s"].progRev, "the view folds the commit's own write")
	assert.Contains(t, a.owned, "s")
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
	assert.Contains(t, a.owned, "s", "the split is still held")
	assert.Equal(t, landedRev, a.splits["s"].progRev)
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
	assert.Equal(t, rev, a.splits["s"].progRev)
	assert.Contains(t, a.owned, "s")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.writes.WithLabelValues("conflict")))
}

func TestCommitLostToAnotherOwnerIsFencedAndEmitsLost(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))

	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: NewSplitProgress(8, nil)})
	assert.True(t, IsFenced(err), "got %v", err)
	assert.NotContains(t, a.owned, "s")
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
			<-a.results.sig
			loopErr = a.runResults()
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
		assert.Equal(t, rev, a.splits["s"].progRev)
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
	assert.NotContains(t, a.owned, "s")
	_, ok := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, ok, "the completed split's lease is deleted")
	assert.Equal(t, 1, a.nCompleted)
	assert.Empty(t, lostSplits(events(t, a)), "completing is no loss")
	err := send(t, a, &command{kind: cmdCommit, split: MustSplitID("s"), progress: CompletedProgress(9, nil)})
	assert.True(t, IsFenced(err), "a commit after completion is fenced: %v", err)
}

// ----- fail ------------------------------------------------------------------------

func TestFailConsumesAnAttemptAndHandsTheSplitBack(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison"}))
	settleIO(t, a)
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, uint32(1), r.Attempts)
	assert.Nil(t, r.Owner)
	assert.Equal(t, uint64(2), r.Epoch, "below the cap the epoch stays")
	assert.Equal(t, statusRunnable, r.Status)
	assert.NotContains(t, a.owned, "s")
	_, ok := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, ok, "the lease is dropped")
	assert.Empty(t, lostSplits(events(t, a)), "the source asked for it: no Lost")
}

func TestFailAtTheCapQuarantinesAndFencesZombies(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	r := rec("s", 2, "me")
	r.Attempts = uint32(a.cfg.MaxAttempts - 1)
	holdSplit(t, a, st, "s", 2, r)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison"}))
	got, _ := storedProgress(t, st, "s")
	assert.Equal(t, statusQuarant, got.Status)
	assert.Equal(t, uint64(3), got.Epoch, "quarantine bumps the epoch")
	assert.Equal(t, 1, a.nQuarant)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.quarantines))
	var quarantined []Quarantined
	for _, e := range events(t, a) {
		if q, ok := e.(Quarantined); ok {
			quarantined = append(quarantined, q)
		}
	}
	assert.Equal(t, []Quarantined{{Split: MustSplitID("s"), Attempts: uint32(a.cfg.MaxAttempts)}}, quarantined)
	assert.Equal(t, "poison", got.LastFailure, "the record keeps why the split was set aside")
}

// A recorded failure reason is bounded and valid UTF-8, whatever the
// source passed; a death without progress records its own.
func TestFailureReasonsAreBoundedAndNamed(t *testing.T) {
	long := strings.Repeat("é", 400) + "\xff<script>"
	got := failureText(long)
	assert.LessOrEqual(t, len(got), maxFailureLen)
	assert.True(t, utf8.ValidString(got))
	assert.True(t, strings.HasSuffix(got, "…"))
	assert.Equal(t, "bad \uFFFD?", failureText("bad \uFFFD\xff"))
	assert.Contains(t, deathText("w-2", 7), "w-2 at epoch 7")

	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: long}))
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, got, r.LastFailure)
	assert.Equal(t, uint32(1), r.Attempts)
}

func TestFailLosingItsCASIsFenced(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))
	err := send(t, a, &command{kind: cmdFail, split: MustSplitID("s")})
	assert.True(t, IsFenced(err), "got %v", err)
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	got, _ := storedProgress(t, st, "s")
	assert.Zero(t, got.Attempts, "nothing was written")
}

// ----- release ---------------------------------------------------------------------

func TestReleaseClearsTheOwnerKeepsTheEpochAndDeparts(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	holdSplit(t, a, st, "t", 7, nil)
	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("s")}}))
	settleIO(t, a)
	r, _ := storedProgress(t, st, "s")
	assert.Nil(t, r.Owner)
	assert.Equal(t, uint64(2), r.Epoch)
	assert.Zero(t, r.Attempts)
	assert.False(t, a.parting, "a worker still holding splits has not departed")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.releases))

	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("t"), MustSplitID("unheld")}}))
	settleIO(t, a)
	assert.True(t, a.parting, "releasing the last held split is a departure")
	assert.Empty(t, a.owned)
	assert.Empty(t, a.handingBack)
	assert.Zero(t, a.undrained)
}

func TestDrainedReleaseIsNeverADeparture(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	a.beginRevocation("s", a.renew.leases["s"].lastOK)
	require.NoError(t, send(t, a, &command{kind: cmdReleaseDrained, splits: []SplitID{MustSplitID("s")}}))
	settleIO(t, a)
	assert.False(t, a.parting)
	assert.Empty(t, a.revocations)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.revocations.WithLabelValues("drained")))
}

func TestReleaseWhoseRecordMovedIsFenced(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	holdSplit(t, a, st, "t", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))
	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("s")}}))
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, "peer", r.owner())
	assert.Zero(t, testutil.ToFloat64(a.m.releases))
}

func TestNotHeldIsFenced(t *testing.T) {
	err := notHeld("s")
	assert.True(t, errors.Is(err, ErrFenced))
	assert.Contains(t, err.Error(), "split s")
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
