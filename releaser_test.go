package spate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeReleaser is the fake store with the [Releaser] capability: the
// owner-clear and the lease delete in one call, recorded as one.
type fakeReleaser struct{ *fakeStore }

func (s fakeReleaser) Capabilities() Capabilities {
	c := s.fakeStore.Capabilities()
	c.UpdateAndDelete = true
	return c
}

func (s fakeReleaser) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (Outcome, Outcome, error) {
	f, err := s.begin(ctx, fakeCall{op: "update-and-delete", ks: Durable, key: durableKey, value: value, expected: expected})
	if err != nil {
		return Outcome{}, Outcome{}, err
	}
	if f.err != nil && !f.landed {
		return Outcome{}, Outcome{}, f.err
	}
	s.mu.Lock()
	var u, d Outcome
	if e, ok := s.data[Durable][durableKey]; ok && e.Revision == expected {
		s.rev++
		s.data[Durable][durableKey] = Entry{Key: durableKey, Value: slices.Clone(value), Revision: s.rev}
		u = Won(s.rev)
		if e, ok := s.data[Ephemeral][ephemeralKey]; ok && e.Revision == leaseExpected {
			s.rev++
			delete(s.data[Ephemeral], ephemeralKey)
			d = Won(s.rev)
		}
	}
	s.mu.Unlock()
	if f.err != nil {
		return Outcome{}, Outcome{}, f.err
	}
	return u, d, nil
}

var _ Releaser = fakeReleaser{}

func releaseCmd(t *testing.T, a *actor, ids ...string) {
	t.Helper()
	var splits []SplitID
	for _, id := range ids {
		splits = append(splits, MustSplitID(id))
	}
	cmd := &command{kind: cmdRelease, splits: splits, reply: make(chan error, 1)}
	require.NoError(t, a.handle(cmd))
	settleIO(t, a)
	require.NoError(t, <-cmd.reply)
}

// A renewal that was in flight when the release stopped the renewer lands
// first and moves the lease's revision: the atomic call clears the owner
// but loses the delete's guard, and the plain path's delete (re-read,
// still ours, delete) finishes the release.
func TestAtomicReleaseFallsBackWhenARenewalMovedTheLease(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, fakeReleaser{st}, testConfig())
	holdSplit(t, a, st, "keep", 1, nil)
	holdSplit(t, a, st, "s", 1, nil)
	lease, ok := st.entry(Ephemeral, prefixSplit+"s")
	require.True(t, ok)
	// The renewal in flight: it lands after the renewer's hold was taken,
	// so the renewer never learns its revision.
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update-and-delete" {
			st.put(Ephemeral, prefixSplit+"s", lease.Value)
			st.setFault(nil)
		}
		return fakeFault{}
	})
	n := len(st.calls)
	releaseCmd(t, a, "s")
	settleIO(t, a)

	_, leased := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, leased, "the fallback deleted the renewed lease")
	r, _ := storedProgress(t, st, "s")
	assert.Empty(t, r.owner())
	var ops []string
	for _, c := range st.calls[n:] {
		ops = append(ops, c.op)
	}
	assert.Equal(t, []string{"update-and-delete", "delete", "get", "delete"}, ops,
		"the atomic call, then deleteOwnLease: the guard at the old revision loses, the re-read finds our lease, the delete at its revision wins")
	assert.NotContains(t, a.worker.owned, "s")
	assert.Empty(t, lostSplits(events(t, a)), "a release is not a loss")
}

// The atomic release's owner-clear loses its compare-and-swap (a claimant
// fenced this tenancy): nothing is deleted and the split is lost, as on
// the plain path.
func TestAtomicReleaseFencedDeletesNothing(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, fakeReleaser{st}, testConfig())
	holdSplit(t, a, st, "keep", 1, nil)
	holdSplit(t, a, st, "s", 1, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 2, "peer")))
	releaseCmd(t, a, "s")

	_, leased := st.entry(Ephemeral, prefixSplit+"s")
	assert.True(t, leased, "a lost owner-clear deletes nothing")
	assert.Zero(t, st.count("delete", prefixSplit), "no plain delete either")
	assert.NotContains(t, a.worker.owned, "s")
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
}

// A renewal that started before the release took the renewer's hold and
// finds the lease deleted reports no loss: the loop is releasing it.
func TestRenewalAfterTakeReportsNoLoss(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, fakeReleaser{st}, testConfig())
	holdSplit(t, a, st, "s", 1, nil)
	h, ok := a.renew.take("s")
	require.True(t, ok)
	st.remove(Ephemeral, prefixSplit+"s")
	a.renew.renewLease(context.Background(), "s", h)
	assert.Empty(t, a.renew.notes.take(), "no note for a lease the renewer no longer holds")

	// Still held: the same renewal reports the loss.
	holdSplit(t, a, st, "t", 1, nil)
	h, _ = a.renew.take("t")
	a.renew.hold("t", h.epoch, h.rev, h.lastOK, nil)
	st.remove(Ephemeral, prefixSplit+"t")
	a.renew.renewLease(context.Background(), "t", h)
	notes := a.renew.notes.take()
	require.Len(t, notes, 1)
	assert.Equal(t, noteLost, notes[0].kind)
}

// The atomic release's call fails (its reply lost after it landed): the
// split is surrendered and the plain delete finds the lease gone.
func TestAtomicReleaseErrorSurrenders(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, fakeReleaser{st}, testConfig())
	holdSplit(t, a, st, "keep", 1, nil)
	holdSplit(t, a, st, "s", 1, nil)
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update-and-delete" {
			return fakeFault{err: Retryablef("fake: reply lost"), landed: true}
		}
		return fakeFault{}
	})
	releaseCmd(t, a, "s")
	settleIO(t, a)
	assert.NotContains(t, a.worker.owned, "s")
	_, leased := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, leased)
	assert.Zero(t, a.renew.leaseRev("s"), "the renewer no longer renews it")
}

// The coordinator's metered wrapper passes the capability on, and reports
// it only when it does.
func TestMeteredStorePassesTheReleaserOn(t *testing.T) {
	m, err := newCoordMetrics(nil, nil)
	require.NoError(t, err)
	plain := newMeteredStore(newFakeStore(), time.Second, time.Second, m)
	_, ok := ReleaserOf(plain)
	assert.False(t, ok)
	_, _, err = plain.UpdateAndDelete(t.Context(), "split.a", nil, 1, "split.a", 2)
	assert.True(t, IsFatal(err), "%v", err)

	st := newFakeStore()
	rec := st.put(Durable, "split.a", []byte("owned"))
	lease := st.put(Ephemeral, "split.a", []byte("lease"))
	ms := newMeteredStore(fakeReleaser{st}, time.Second, time.Second, m)
	r, ok := ReleaserOf(ms)
	require.True(t, ok)
	u, d, err := r.UpdateAndDelete(t.Context(), "split.a", []byte("released"), rec, "split.a", lease)
	require.NoError(t, err)
	assert.True(t, u.Won && d.Won)
	assert.Equal(t, 1, st.count("update-and-delete", "split.a"))
}

// The watches may deliver the atomic release's lease delete, and a peer's
// claim after it, before the release's answer is folded: the tenancy ends
// as a release, not as a loss.
func TestAtomicReleaseIsNotLostToItsOwnEvents(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, fakeReleaser{st}, testConfig())
	holdSplit(t, a, st, "keep", 1, nil)
	holdSplit(t, a, st, "s", 1, nil)
	cmd := &command{kind: cmdRelease, splits: []SplitID{MustSplitID("s")}, reply: make(chan error, 1)}
	require.NoError(t, a.handle(cmd))
	a.io.wg.Wait() // the call has landed; its answer is not folded yet
	_, leased := st.entry(Ephemeral, prefixSplit+"s")
	require.False(t, leased)

	// The lease delete, then a peer's lease and its epoch-bumping claim.
	a.ephemeralDelete(prefixSplit+"s", st.rev, false)
	peer := leaseVal{Schema: SchemaVersion, Owner: "peer", Nonce: "n", Epoch: 2}
	require.NoError(t, a.ephemeralPut(prefixSplit+"s", encode(peer), st.put(Ephemeral, prefixSplit+"s", encode(peer))))
	r := rec("s", 2, "peer")
	a.upsert("s", r, st.put(Durable, prefixSplit+"s", encode(r)), live)
	assert.Contains(t, a.worker.owned, "s", "the release's answer decides")

	settleIO(t, a)
	require.NoError(t, <-cmd.reply)
	assert.NotContains(t, a.worker.owned, "s")
	assert.Empty(t, lostSplits(events(t, a)), "a release is not a loss")
	assert.Equal(t, float64(1), testutil.ToFloat64(a.m.releases), "counted as a release")
}
