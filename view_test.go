package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func watermarkOf(v *splitView) int64 {
	if v.prog == nil || v.prog.Watermark == nil {
		return -1
	}
	return *v.prog.Watermark
}

func recAt(id string, watermark int64) *progressRecord {
	r := rec(id, 1, "")
	r.Watermark = wm(watermark)
	return r
}

// ----- upsert: the per-entry loop clock guard ------------------------------------------

func TestUpsertRevisionGuard(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.upsert("s", recAt("s", 10), 10, live)
	v := a.job.splits["s"]
	require.Equal(t, 1, a.job.nSplits)
	require.True(t, a.dirty, "a new split is an assignment input change")

	a.upsert("s", recAt("s", 5), 5, live)
	assert.Equal(t, int64(10), watermarkOf(v), "a live value below the held revision is a stale echo")
	a.upsert("s", recAt("s", 6), 10, live)
	assert.Equal(t, int64(10), watermarkOf(v), "a live value at the held revision is a stale echo")

	since := a.job.mark()
	a.upsert("s", recAt("s", 10), 10, readSince(since))
	assert.Equal(t, uint64(10), v.progRev, "a read at the held revision changes nothing")

	// A read below the held revision, with nothing changed since it
	// started: the store went back in time, and the view follows it.
	a.upsert("s", recAt("s", 7), 7, readSince(since))
	assert.Equal(t, int64(7), watermarkOf(v))
	assert.Equal(t, uint64(7), v.progRev)

	// A read that started before a later change can never undo it.
	since = a.job.mark()
	a.upsert("s", recAt("s", 12), 12, live) // lands after the read started
	a.upsert("s", recAt("s", 9), 9, readSince(since))
	assert.Equal(t, int64(12), watermarkOf(v), "the older read was ignored")
	assert.Equal(t, uint64(12), v.progRev)

	// Also when the change came from another read that started later.
	early := a.job.mark()
	late := a.job.mark()
	a.upsert("s", recAt("s", 20), 20, readSince(late))
	a.upsert("s", recAt("s", 15), 15, readSince(early))
	assert.Equal(t, int64(20), watermarkOf(v))

	// A later read, started after the last change, may adopt a lower
	// revision again.
	later := a.job.mark()
	a.upsert("s", recAt("s", 16), 16, readSince(later))
	assert.Equal(t, int64(16), watermarkOf(v))
	assert.Equal(t, 1, a.job.nSplits, "one split throughout")
}

func TestDurablePutSkipsAnEchoOfTheHeldRevision(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.upsert("s", recAt("s", 3), 8, live)
	// Undecodable at the held revision: not even decoded.
	require.NoError(t, a.durablePut(prefixSplit+"s", []byte("garbage"), 8, live))
	assert.Empty(t, a.records.damaged, "an echo of the held revision is never decoded")
	require.NoError(t, a.durablePut(prefixSplit+"s", []byte("garbage"), 9, live))
	assert.Contains(t, a.records.damaged, prefixSplit+"s", "a new revision is decoded, and an unreadable one damages its split")
}

func TestUpsertCountsStatusesAndEmitsQuarantinedOncePerTransition(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	q := rec("old", 3, "")
	q.Status = statusQuarant
	a.upsert("old", q, 1, live)
	assert.Equal(t, 1, a.job.nQuarant)
	assert.Empty(t, events(t, a), "a split first seen quarantined is no transition")

	a.upsert("s", rec("s", 1, "peer"), 2, live)
	done := rec("s", 1, "peer")
	done.Status, done.Completed = statusCompleted, true
	a.upsert("s", done, 3, live)
	assert.Equal(t, 1, a.job.nCompleted)

	r := rec("r", 1, "")
	a.upsert("r", r, 4, live)
	q2 := rec("r", 2, "")
	q2.Status, q2.Attempts = statusQuarant, 4
	a.upsert("r", q2, 5, live)
	a.upsert("r", q2, 5, live) // echo
	q3 := *q2
	a.upsert("r", &q3, 6, live) // rewritten, still quarantined
	assert.Equal(t, []Event{Quarantined{Split: MustSplitID("r"), Attempts: 4}}, events(t, a))
	assert.Equal(t, 2, a.job.nQuarant)
	assert.Equal(t, 3, a.job.nSplits)

	// Back to runnable (an operator's reset): the counts follow.
	a.upsert("r", rec("r", 3, ""), 7, live)
	assert.Equal(t, 1, a.job.nQuarant)
}

func TestUpsertFlagsAQuarantineScanAtTheAttemptCap(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	r := rec("s", 1, "dead")
	r.Attempts = uint32(a.cfg.MaxAttempts - 2)
	a.upsert("s", r, 1, live)
	assert.False(t, a.worker.quarantineScan)
	r2 := r.clone()
	r2.Attempts++
	a.upsert("s", r2, 2, live)
	assert.True(t, a.worker.quarantineScan, "a runnable split whose next takeover reaches the cap is pending quarantine")
}

func TestUpsertDropsAHeldSplitFencedAtAHigherEpoch(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	a.upsert("s", rec("s", 2, "me"), 100, live)
	assert.Contains(t, a.worker.owned, "s", "our own epoch is no fence")
	a.upsert("s", rec("s", 3, "peer"), 101, live)
	assert.NotContains(t, a.worker.owned, "s")
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	assert.Zero(t, a.renew.leaseRev("s"))
}

// ----- ephemeral keys --------------------------------------------------------------

func leaseBytes(owner, nonce string, epoch uint64) []byte {
	return encode(leaseVal{Schema: SchemaVersion, Owner: owner, Nonce: nonce, Epoch: epoch})
}

func workerBytes(nonce string, maxInFlight int) []byte {
	return encode(workerVal{Schema: SchemaVersion, Nonce: nonce, MaxInFlight: maxInFlight})
}

func leaderBytes(owner, nonce string, gen uint64) []byte {
	return encode(leaderVal{Schema: SchemaVersion, Owner: owner, Nonce: nonce, Generation: gen})
}

// applyEphemeral is a complete read: what the view holds from before the
// read's mark and the read does not list is gone; what changed after the
// mark stays, listed or not.
func TestApplyEphemeralKeepsEntriesTouchedAfterTheMark(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	require.NoError(t, a.ephemeralPut(prefixWorker+"old", workerBytes("n1", 2), 1))
	require.NoError(t, a.ephemeralPut(prefixWorker+"listed", workerBytes("n2", 2), 2))
	require.NoError(t, a.ephemeralPut(prefixSplit+"x", leaseBytes("peer", "np", 1), 3))
	require.NoError(t, a.ephemeralPut(keyLeader, leaderBytes("peer", "np", 1), 4))
	mark := a.job.mark()
	require.NoError(t, a.ephemeralPut(prefixWorker+"new", workerBytes("n3", 2), 5))
	require.NoError(t, a.ephemeralPut(prefixSplit+"y", leaseBytes("peer", "np", 1), 6))
	before := time.Now()

	require.NoError(t, a.applyEphemeral([]Entry{
		{Key: prefixWorker + "listed", Value: workerBytes("n2", 5), Revision: 7},
		{Key: prefixWorker + "fresh", Value: workerBytes("n4", 1), Revision: 8},
	}, mark))

	assert.NotContains(t, a.members.presence, "old", "unlisted and older than the read: gone")
	assert.Contains(t, a.members.departed, "old", "a vanished peer starts its rebalance-delay window")
	assert.False(t, a.members.departed["old"].Before(before))
	assert.NotContains(t, a.members.caps, "old")
	assert.Contains(t, a.members.presence, "new", "changed after the read started: kept")
	assert.Equal(t, uint64(7), a.members.presence["listed"].rev)
	assert.Equal(t, 5, a.members.caps["listed"], "a listed record is folded")
	assert.Contains(t, a.members.presence, "fresh")
	assert.Nil(t, a.job.splits["x"].lease, "an older lease the read does not list is gone")
	assert.Equal(t, uint64(3), a.job.splits["x"].leaseRev, "a forced absence keeps the revision seen")
	assert.NotNil(t, a.job.splits["y"].lease, "a lease put after the mark is kept")
	assert.Nil(t, a.leader.key, "an older leader key the read does not list is gone")

	// A leader key seen after the mark survives a read that missed it.
	mark2 := a.job.mark()
	require.NoError(t, a.ephemeralPut(keyLeader, leaderBytes("peer", "np", 2), 9))
	require.NoError(t, a.applyEphemeral(nil, mark2))
	assert.NotNil(t, a.leader.key)
	assert.NotContains(t, a.members.presence, "new", "the entry kept by the first read predates the second, which misses it: gone")
	assert.Nil(t, a.job.splits["y"].lease)
}

func TestEphemeralPresenceLifecycle(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", workerBytes("n", 6), 3))
	assert.True(t, a.dirty)
	assert.Equal(t, 6, a.members.caps["p"])
	assert.True(t, a.members.presence["p"].unproven, "a member first seen may be a dead process's record")
	a.dirty = false
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", workerBytes("n", 6), 3))
	assert.False(t, a.dirty, "a stale renewal changes nothing")
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", workerBytes("n", 6), 4))
	assert.True(t, a.dirty, "its first renewal proves it alive: it may now be given held splits")
	assert.False(t, a.members.presence["p"].unproven)
	a.dirty = false
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", workerBytes("n", 6), 5))
	assert.False(t, a.dirty, "a renewal of a known member with an unchanged cap changes nothing")
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", []byte("garbage"), 6))
	assert.Equal(t, 6, a.members.caps["p"], "an unreadable presence record keeps the member, at its last cap")

	a.ephemeralDelete(prefixWorker+"p", 4, false)
	assert.Contains(t, a.members.presence, "p", "a delete at or below the held revision is stale")
	a.ephemeralDelete(prefixWorker+"p", 7, false)
	assert.NotContains(t, a.members.presence, "p")
	assert.Contains(t, a.members.departed, "p")
	require.NoError(t, a.ephemeralPut(prefixWorker+"p", workerBytes("n2", 6), 8))
	assert.NotContains(t, a.members.departed, "p", "a returning instance cancels its window")
}

func TestEphemeralOwnPresence(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.renew.presenceWritten(5)
	require.NoError(t, a.ephemeralPut(prefixWorker+"me", workerBytes("nonce-me", 4), 5))
	assert.Empty(t, a.renew.check, "our own record needs no check")
	require.NoError(t, a.ephemeralPut(prefixWorker+"me", workerBytes("twin", 4), 6))
	assert.Len(t, a.renew.check, 1, "our instance id under another nonce makes the renewer check presence")
	<-a.renew.check

	a.ephemeralDelete(prefixWorker+"me", 7, false)
	assert.Len(t, a.renew.check, 1, "our presence expired: the renewer rewrites it at once")
	assert.Zero(t, a.renew.presRev, "the renewer re-creates it instead of updating a revision that is gone")
	assert.NotContains(t, a.members.departed, "me", "we are no departed peer")
}

func TestEphemeralLeaseOfAHeldSplit(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "ours", 2, nil)
	holdSplit(t, a, st, "twin", 2, nil)
	holdSplit(t, a, st, "peer", 2, nil)
	rev := a.job.splits["ours"].leaseRev

	require.NoError(t, a.ephemeralPut(prefixSplit+"ours", leaseBytes("me", "nonce-me", 2), rev+100))
	assert.Contains(t, a.worker.owned, "ours", "our own renewal's echo")

	require.NoError(t, a.ephemeralPut(prefixSplit+"peer", leaseBytes("other", "n-other", 3), rev+101))
	assert.NotContains(t, a.worker.owned, "peer")

	require.NoError(t, a.ephemeralPut(prefixSplit+"twin", leaseBytes("me", "n-twin", 3), rev+102))
	assert.NotContains(t, a.worker.owned, "twin")
	assert.Len(t, a.renew.check, 1, "a lease taken under our instance id makes the renewer check presence")
	assert.ElementsMatch(t, []string{"peer", "twin"}, lostSplits(events(t, a)))

	err := a.ephemeralPut(prefixSplit+"ours", []byte(`{"schema":1,"owner":"","nonce":"x","epoch":1}`), rev+103)
	assert.True(t, IsFatal(err), "an alien lease record is Fatal: %v", err)
}

func TestEphemeralDeleteOfAHeldLease(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	rev := a.renew.leaseRev("s")
	a.renew.leases["s"].rev = rev + 10 // the renewer renewed it since

	a.ephemeralDelete(prefixSplit+"s", rev+5, false)
	assert.Contains(t, a.worker.owned, "s", "a delete below the renewer's revision is older than our latest write")
	a.ephemeralDelete(prefixSplit+"s", rev+11, false)
	assert.NotContains(t, a.worker.owned, "s")
	assert.Equal(t, uint64(2), a.worker.selfFenced["s"], "an expired lease is a self-fence at its epoch, forgiven once")
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	assert.Nil(t, a.job.splits["s"].lease)
	assert.Equal(t, rev+11, a.job.splits["s"].leaseRev)
}

func TestEphemeralLeaderKey(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.leader.term = &leadership{generation: 2}
	require.NoError(t, a.ephemeralPut(keyLeader, leaderBytes("me", "nonce-me", 2), 5))
	assert.NotNil(t, a.leader.term, "our own leader key")
	require.NoError(t, a.ephemeralPut(keyLeader, leaderBytes("me", "nonce-me", 2), 4))
	assert.Equal(t, uint64(5), a.leader.keyRev)
	require.NoError(t, a.ephemeralPut(keyLeader, leaderBytes("peer", "np", 3), 6))
	assert.Nil(t, a.leader.term, "the leader key now belongs to another: demoted")
	assert.Equal(t, "peer", a.leader.key.Owner)

	a.leader.term = &leadership{generation: 3}
	a.renew.setLeader(8, 3)
	a.ephemeralDelete(keyLeader, 7, false)
	assert.NotNil(t, a.leader.term, "a delete older than our own leader write does not end leadership")
	assert.Nil(t, a.leader.key)
	a.ephemeralDelete(keyLeader, 9, false)
	assert.Nil(t, a.leader.term, "the leader key expired")
	assert.Zero(t, a.renew.leaderRev(), "the renewer stops renewing it")
}

// ----- durable keys ----------------------------------------------------------------

func TestApplyDurableCompleteDropsOnlyOlderAssignments(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.setAssign("me", &assignmentVal{Schema: SchemaVersion, Generation: 1, Splits: []string{"s"}}, 1)
	a.setAssign("old", &assignmentVal{Schema: SchemaVersion, Generation: 1, Splits: []string{"t"}}, 2)
	mark := a.job.mark()
	a.setAssign("new", &assignmentVal{Schema: SchemaVersion, Generation: 1, Splits: []string{"u"}}, 3)
	require.True(t, a.worker.assignSeen)
	require.Contains(t, a.worker.awaiting, "s")

	require.NoError(t, a.applyDurable(nil, mark, false))
	assert.Len(t, a.assigns.byInst, 3, "a partial read deletes nothing")

	require.NoError(t, a.applyDurable(nil, mark, true))
	assert.NotContains(t, a.assigns.byInst, "old")
	assert.NotContains(t, a.assigns.byInst, "me")
	assert.Contains(t, a.assigns.byInst, "new", "written after the read started: kept")
	assert.False(t, a.worker.assignSeen, "our own record gone: no instruction (which is not an empty one)")
	assert.Empty(t, a.worker.assigned)
	assert.Empty(t, a.worker.awaiting)
}

func TestApplyDurableFoldsEntries(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen, Planned: 1}
	spec := &specRecord{Schema: SchemaVersion, ID: "s", FP: testFPHash, Weight: 3, Descriptor: []byte("d")}
	mark := a.job.mark()
	require.NoError(t, a.applyDurable([]Entry{
		{Key: keyPlan, Value: encode(p), Revision: 1},
		{Key: prefixSpec + "s", Value: encode(spec), Revision: 2},
		{Key: prefixSplit + "s", Value: encode(rec("s", 0, "")), Revision: 3},
		{Key: prefixAssign + "peer", Value: encode(&assignmentVal{Schema: SchemaVersion, Splits: []string{"s"}}), Revision: 4},
		{Key: prefixAssign + "bad", Value: []byte("{}"), Revision: 5},
	}, mark, true))
	assert.Equal(t, uint64(1), a.planning.planRev)
	assert.Equal(t, uint64(3), a.job.splits["s"].spec.Weight)
	assert.Equal(t, uint64(3), a.job.splits["s"].progRev)
	assert.Contains(t, a.assigns.byInst, "peer")
	assert.NotContains(t, a.assigns.byInst, "bad", "an unreadable assignment is ignored, never read as an empty one")

	other := &specRecord{Schema: SchemaVersion, ID: "s", FP: testFPHash, Weight: 9, Descriptor: []byte("e")}
	require.NoError(t, a.durablePut(prefixSpec+"s", encode(other), 9, live))
	assert.Equal(t, uint64(3), a.job.splits["s"].spec.Weight, "a spec is immutable: the first copy wins")

	wrongJob := *p
	wrongJob.Fingerprint = "another:job"
	err := a.durablePut(keyPlan, encode(&wrongJob), 10, live)
	assert.True(t, IsFatal(err), "a plan of another job is Fatal: %v", err)
}

func TestAPlanFromASuccessorDemotes(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.leader.term = &leadership{generation: 2}
	p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen, Generation: 2}
	require.NoError(t, a.durablePut(keyPlan, encode(p), 5, live))
	assert.NotNil(t, a.leader.term, "our own generation")
	p3 := *p
	p3.Generation = 3
	require.NoError(t, a.durablePut(keyPlan, encode(&p3), 6, live))
	assert.Nil(t, a.leader.term)
	seq := a.job.durableSeq
	require.NoError(t, a.durablePut(keyPlan, encode(p), 6, live))
	assert.Equal(t, uint64(3), a.planning.plan.Generation, "a plan at or below the held revision is stale")
	assert.Equal(t, seq, a.job.durableSeq)
}

func TestAdoptAssignment(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.worker.owned["held"] = &tenancy{epoch: 1}
	t0 := time.Unix(100, 0)
	a.adoptAssignment(&assignmentVal{Generation: 5, Splits: []string{"held", "a", "b"}}, t0)
	assert.Equal(t, map[string]bool{"held": true, "a": true, "b": true}, a.worker.assigned)
	assert.Equal(t, map[string]time.Time{"a": t0, "b": t0}, a.worker.awaiting, "held splits are not awaited")

	a.adoptAssignment(&assignmentVal{Generation: 5, Splits: []string{"b", "c"}}, t0.Add(time.Second))
	assert.Equal(t, map[string]time.Time{"b": t0, "c": t0.Add(time.Second)}, a.worker.awaiting, "awaiting keeps its first naming time")

	a.adoptAssignment(&assignmentVal{Generation: 4, Splits: []string{}}, t0.Add(2*time.Second))
	assert.Equal(t, map[string]bool{"b": true, "c": true}, a.worker.assigned, "a deposed leader's older generation is ignored")
}

// ----- membership ----------------------------------------------------------------

// A heartbeat (the same lease bytes at a later revision) is folded without
// a decode and without step work; only a change of holder is news.
func TestAHeartbeatOfAnotherWorkersLeaseIsFoldedWithoutWork(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.worker.assigned = map[string]bool{"mine": true}
	lease := leaseBytes("peer", "n-peer", 1)
	require.NoError(t, a.ephemeralPut(prefixSplit+"theirs", lease, 10))
	v := a.job.splits["theirs"]
	require.Equal(t, "peer", v.lease.Owner)
	assert.False(t, a.worker.ownDirty, "another worker's split is no work for this one")

	a.dirty = false
	decoded := v.lease
	require.NoError(t, a.ephemeralPut(prefixSplit+"theirs", lease, 11))
	assert.Same(t, decoded, v.lease, "a heartbeat is not decoded again")
	assert.Equal(t, uint64(11), v.leaseRev)
	assert.False(t, a.dirty, "a heartbeat changes no assignment input")

	// The same holder under a new tenancy is decoded.
	require.NoError(t, a.ephemeralPut(prefixSplit+"theirs", leaseBytes("peer", "n-peer", 2), 12))
	assert.Equal(t, uint64(2), v.lease.Epoch)
	// A corrupt value at a later revision is never mistaken for a heartbeat.
	err := a.ephemeralPut(prefixSplit+"theirs", []byte(`{"schema":1,"owner":"","nonce":"x","epoch":1}`), 13)
	assert.True(t, IsFatal(err), "an alien lease record is Fatal: %v", err)

	require.NoError(t, a.ephemeralPut(prefixSplit+"mine", lease, 14))
	assert.True(t, a.worker.ownDirty, "a change to an assigned split re-runs the own-split reconcile")
	a.worker.ownDirty = false
	a.ephemeralDelete(prefixSplit+"mine", 15, false)
	assert.True(t, a.worker.ownDirty, "so does its release")

	a.worker.ownDirty = false
	a.upsert("theirs", recAt("theirs", 3), 16, live)
	assert.False(t, a.worker.ownDirty, "another worker's commit is no work for this one")
	a.upsert("mine", recAt("mine", 3), 17, live)
	assert.True(t, a.worker.ownDirty)
}

// A record deleted and restored while this worker re-read it: the re-read
// saw the restored record before the watch delivered the delete. The stale
// delete must not empty the view, or the restored record's own event is
// dropped as an echo and the split never gets a record here again (the
// job hung in DeletedProgressRecordIsRestored).
func TestAStaleDeleteDoesNotForgetARestoredRecord(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.upsert("s", recAt("s", 1), 10, live)
	since := a.job.mark()
	a.upsert("s", recAt("s", 1), 30, readSince(since)) // the restored record, re-read
	require.NoError(t, a.durableDelete(prefixSplit+"s", 20))
	require.NotNil(t, a.job.splits["s"].prog, "a delete older than the record held is stale")
	require.NoError(t, a.durablePut(prefixSplit+"s", encode(recAt("s", 1)), 30, live))
	assert.Equal(t, uint64(30), a.job.splits["s"].progRev)

	// A real delete: the record is gone, a value older than the delete
	// does not bring it back, and a re-creation does.
	require.NoError(t, a.durableDelete(prefixSplit+"s", 40))
	require.Nil(t, a.job.splits["s"].prog)
	a.upsert("s", recAt("s", 1), 30, live)
	assert.Nil(t, a.job.splits["s"].prog, "a value older than the delete is stale")
	a.upsert("s", recAt("s", 1), 50, live)
	assert.NotNil(t, a.job.splits["s"].prog, "a re-created record is adopted")
}

// A member whose id was generated cannot come back: its departure opens no
// rebalance-delay window, so its splits are reassigned at once. Before,
// takeover waited the 20 s delay on a 3 s lease (22.8 s measured).
func TestAGeneratedMemberDepartsWithoutADelay(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	gen := Config{}.WithDefaults().InstanceID
	require.NoError(t, a.ephemeralPut(prefixWorker+gen, workerBytes("n", 2), 3))
	require.NoError(t, a.ephemeralPut(prefixWorker+"pod-0", workerBytes("m", 2), 4))
	a.ephemeralDelete(prefixWorker+gen, 5, false)
	a.ephemeralDelete(prefixWorker+"pod-0", 6, false)
	assert.NotContains(t, a.members.departed, gen, "a generated id never comes back: no window")
	assert.Contains(t, a.members.departed, "pod-0", "a stable id may come back: its splits wait out the window")
}

// A leader elected after a worker died never saw its presence record: it
// tells a generated id by its form, and opens no window for it either.
func TestInferDepartedSkipsGeneratedIDs(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	gen := Config{}.WithDefaults().InstanceID
	require.True(t, isGeneratedID(gen))
	require.False(t, isGeneratedID("pod-0"))
	require.False(t, isGeneratedID("spate-XYZ"))
	a.job.view("s1").prog = rec("s1", 1, gen)
	a.job.view("s2").prog = rec("s2", 1, "pod-0")
	a.members.inferDeparted(a.job.splits, time.Now(), a.cfg.RebalanceDelay, a.log)
	assert.NotContains(t, a.members.departed, gen)
	assert.Contains(t, a.members.departed, "pod-0")
}

func TestTheJobViewsClockAndCountsAreItsOwn(t *testing.T) {
	j := jobView{splits: map[string]*splitView{}}
	m1 := j.mark()
	m2 := j.mark()
	assert.Less(t, m1, m2, "each read of the store starts at a later mark")

	v := j.view("s")
	require.NotNil(t, v)
	assert.Same(t, v, j.view("s"), "a split has one view")
	assert.Len(t, j.splits, 1)

	j.count(statusCompleted, 2)
	j.count(statusQuarant, 1)
	j.count(statusRunnable, 5) // not counted
	j.count(statusCompleted, -1)
	assert.Equal(t, 1, j.nCompleted)
	assert.Equal(t, 1, j.nQuarant)
}
