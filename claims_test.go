package spate

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClaimKindsAndOrder(t *testing.T) {
	in := []claimInput{
		{id: "z-expired", status: statusRunnable, owner: "dead", epoch: 3, hasSpec: true},
		{id: "y-reclaim", status: statusRunnable, owner: "me", epoch: 2, leaseOwner: "me", hasSpec: true},
		{id: "x-released", status: statusRunnable, epoch: 4, hasSpec: true},
		{id: "w-create", status: statusRunnable, hasSpec: true},
		{id: "a-create", status: statusRunnable, hasSpec: true},
		{id: "foreign", status: statusRunnable, owner: "peer", leaseOwner: "peer", epoch: 1, hasSpec: true},
		{id: "done", status: statusCompleted, hasSpec: true},
		{id: "parked", status: statusQuarant, hasSpec: true},
		{id: "mine", status: statusRunnable, owner: "me", leaseOwner: "me", leaseOurs: true, held: true, hasSpec: true},
		{id: "leftover", status: statusRunnable, epoch: 2, leaseOwner: "me", leaseOurs: true, hasSpec: true},
	}
	var got []string
	for _, c := range claimCandidates(in, "me", 4) {
		got = append(got, fmt.Sprintf("%s:%s:%t", c.id, c.kind, c.quarantine))
	}
	want := "[a-create:create:false w-create:create:false leftover:released:false x-released:released:false y-reclaim:reclaim:false z-expired:expired:false]"
	assert.Equal(t, want, fmt.Sprint(got))
}

func TestClaimAttemptsGateFlipsToQuarantineAtTheCap(t *testing.T) {
	for attempts := uint32(0); attempts < 6; attempts++ {
		for _, in := range []claimInput{
			{id: "expired", status: statusRunnable, owner: "dead", epoch: 1, attempts: attempts, hasSpec: true},
			{id: "reclaim", status: statusRunnable, owner: "me", epoch: 1, attempts: attempts, leaseOwner: "me", hasSpec: true},
		} {
			c := claimCandidates([]claimInput{in}, "me", 4)
			require.Len(t, c, 1, "%s attempts=%d", in.id, attempts)
			assert.Equal(t, attempts+1 >= 4, c[0].quarantine, "%s attempts=%d", in.id, attempts)
		}
		// Graceful kinds never quarantine, however many attempts were spent.
		for _, in := range []claimInput{
			{id: "create", status: statusRunnable, attempts: attempts, hasSpec: true},
			{id: "released", status: statusRunnable, epoch: 2, attempts: attempts, hasSpec: true},
		} {
			c := claimCandidates([]claimInput{in}, "me", 4)
			require.Len(t, c, 1, "%s attempts=%d", in.id, attempts)
			assert.False(t, c[0].quarantine, "%s attempts=%d", in.id, attempts)
		}
	}
}

// A split whose lease delete arrived moments ago while its record still
// names the owner is left alone: the owner-clear of a release is likely
// still on the other watch stream. Once the settle passes it is an
// expired candidate again, and a released split is a candidate at once.
func TestFreshLeaseDeleteWaitsForTheOwnerClear(t *testing.T) {
	in := claimInput{id: "s", status: statusRunnable, owner: "peer", epoch: 3, hasSpec: true, leaseFresh: true}
	assert.Empty(t, claimCandidates([]claimInput{in}, "me", 4), "a fresh lease delete with the owner still set")
	in.attempts = 3
	assert.Empty(t, claimCandidates([]claimInput{in}, "me", 4), "not even a quarantine decision before the settle")
	in.attempts, in.leaseFresh = 0, false
	c := claimCandidates([]claimInput{in}, "me", 4)
	require.Len(t, c, 1)
	assert.Equal(t, claimExpired, c[0].kind)
	in.owner, in.leaseFresh = "", true
	c = claimCandidates([]claimInput{in}, "me", 4)
	require.Len(t, c, 1, "a released split is claimed at once")
	assert.Equal(t, claimReleased, c[0].kind)
}

func TestSpeclessSplitsAreQuarantinableButNotClaimable(t *testing.T) {
	in := []claimInput{
		{id: "claimable-without-spec", status: statusRunnable},
		{id: "poison-without-spec", status: statusRunnable, owner: "dead", epoch: 1, attempts: 3},
	}
	got := claimCandidates(in, "me", 4)
	require.Len(t, got, 1)
	assert.Equal(t, "poison-without-spec", got[0].id)
	assert.True(t, got[0].quarantine)
}

func TestClaimOrderIgnoresWeight(t *testing.T) {
	// The scan has no weight input at all: order is kind, then id.
	in := []claimInput{{id: "b", status: statusRunnable, hasSpec: true}, {id: "a", status: statusRunnable, hasSpec: true}}
	got := claimCandidates(in, "me", 4)
	require.NotEmpty(t, got)
	assert.Equal(t, "a", got[0].id)
}

func TestSelfFencedReclaimConsumesNoAttempt(t *testing.T) {
	in := claimInput{id: "s", status: statusRunnable, owner: "me", epoch: 3, attempts: 3, hasSpec: true}
	c := claimCandidates([]claimInput{in}, "me", 4)
	require.Len(t, c, 1)
	assert.True(t, c[0].quarantine, "a crashed predecessor's split at the cap is quarantined")
	in.selfFenced = true
	c = claimCandidates([]claimInput{in}, "me", 4)
	require.Len(t, c, 1)
	assert.False(t, c[0].quarantine, "a split this process self-fenced is re-claimed attempt-free")
	assert.Equal(t, claimReleased, c[0].kind)
}

// ----- store calls per split lifecycle ------------------------------------------------

// The round trips a split's lifecycle costs, counted at the store: a
// claim is the lease write and the fencing compare-and-swap, a takeover
// no more (it fences on the viewed record and reads only if that loses),
// a commit one write, a release the owner-clear and the lease delete: two
// calls, or one on a store with the Releaser capability.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Run("plain", func(t *testing.T) { storeCallsPerLifecycle(t, false) })
	t.Run("releaser", func(t *testing.T) { storeCallsPerLifecycle(t, true) })
}

func storeCallsPerLifecycle(t *testing.T, atomic bool) {
	st := newFakeStore()
	var store Store = st
	release, why := 2, "release: the owner-clear and the lease delete"
	if atomic {
		store = fakeReleaser{st}
		release, why = 1, "release: the owner-clear and the lease delete in one call"
	}
	a := newTestActor(t, store, testConfig())
	require.Equal(t, atomic, a.rel != nil)
	calls := func() int {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.calls)
	}
	seed := func(id string, r *progressRecord) {
		rev := st.put(Durable, prefixSplit+id, encode(r))
		a.upsert(id, r, rev, live)
		a.job.view(id).spec = &specRecord{Schema: SchemaVersion, ID: id, FP: testFPHash, Weight: 1, Descriptor: []byte{}}
	}
	mode := "plain"
	if atomic {
		mode = "releaser"
	}
	cost := func(what string, f func()) int {
		n := calls()
		f()
		settleIO(t, a)
		// internal/perfreport reads these lines for docs/performance.md.
		t.Logf("lifecycle %s %s=%d", mode, what, calls()-n)
		return calls() - n
	}

	// Releasing the last held split is a departure; hold another one.
	holdSplit(t, a, st, "keep", 1, nil)
	seed("fresh", rec("fresh", 0, ""))
	assert.Equal(t, 2, cost("claim", func() { a.claim(claimCandidate{id: "fresh", kind: claimCreate}) }), "claim")
	require.Contains(t, a.worker.owned, "fresh")

	assert.Equal(t, 1, cost("commit", func() {
		require.NoError(t, a.c.Commit(context.Background(), MustSplitID("fresh"), NewSplitProgress(5, nil)))
	}), "commit")

	assert.Equal(t, release, cost("release", func() {
		cmd := &command{kind: cmdRelease, splits: []SplitID{MustSplitID("fresh")}, reply: make(chan error, 1)}
		require.NoError(t, a.handle(cmd))
		settleIO(t, a)
		require.NoError(t, <-cmd.reply)
	}), why)
	require.NotContains(t, a.worker.owned, "fresh")
	_, leased := st.entry(Ephemeral, prefixSplit+"fresh")
	assert.False(t, leased, "the release deleted the lease")
	r, _ := storedProgress(t, st, "fresh")
	assert.Empty(t, r.owner(), "the release cleared the owner")

	// A peer died holding "dead": its owner is set and its lease is gone.
	seed("dead", rec("dead", 3, "peer"))
	assert.Equal(t, 2, cost("takeover", func() { a.claim(claimCandidate{id: "dead", kind: claimExpired}) }), "takeover")
	require.Contains(t, a.worker.owned, "dead")
	r, _ = storedProgress(t, st, "dead")
	assert.Equal(t, uint32(1), r.Attempts, "the takeover of a dead owner's split without progress is charged")
	assert.Equal(t, deathText("peer", 3), r.LastFailure, "the charged attempt names the tenancy that died")

	// "gone" was released, but the view has not seen the owner-clear yet:
	// the takeover loses its compare-and-swap, reads, and is not charged.
	seed("gone", rec("gone", 3, "peer"))
	st.put(Durable, prefixSplit+"gone", encode(rec("gone", 3, "")))
	assert.Equal(t, 4, cost("late release", func() { a.claim(claimCandidate{id: "gone", kind: claimExpired}) }),
		"lease write, lost compare-and-swap, the read, the compare-and-swap on top")
	require.Contains(t, a.worker.owned, "gone")
	r, _ = storedProgress(t, st, "gone")
	assert.Equal(t, uint32(0), r.Attempts, "a split whose release the view had not seen is not charged")
	assert.Empty(t, r.LastFailure)
}
