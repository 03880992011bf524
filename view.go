package spate

import (
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"
)

// jobView is this worker's view of the job, folded from watch events,
// listings, re-reads and the results of its own writes (upsert is the
// only place a split's progress state changes). Every value carries the
// store revision it was read at; the loop clock orders reads against
// changes (see mark).
type jobView struct {
	splits     map[string]*splitView
	nSplits    int // splits with a progress record
	nCompleted int
	nQuarant   int
	durableSeq uint64 // bumps on every durable change (gates terminal listing)
	clock      uint64 // bumps when a read of the store starts (see mark)

	// parents are the divided splits whose children the leader has not
	// seen created yet (divide.go).
	parents map[string]bool
}

// The local view is how the actor sees the job: folded from watch events,
// listings and the results of its own writes. Every value carries the store
// revision it was read at, and the loop clock at which it was last set
// ("at"), so that a read that started before a later change (a listing or
// a watch snapshot whose answer arrives after a watch event or a write of
// ours) can never undo that change.

// splitView is the local view of one split: its progress record (nil until
// seen: a lease or spec may arrive first), its spec and its live lease.
type splitView struct {
	prog     *progressRecord
	progRev  uint64
	progAt   uint64
	spec     *specRecord
	lease    *leaseVal // nil: no live lease
	leaseSum uint64    // leaseHash of the lease's bytes: a heartbeat rewrites the same bytes
	leaseRev uint64    // highest lease revision seen (put or delete)
	leaseAt  uint64
	// leaseGoneAt is when a watch last delivered the lease's delete (zero
	// after a listing or snapshot found it gone): see releaseSettle.
	leaseGoneAt time.Time
	// pending is this worker's commit in flight, as written: its watch
	// echo is recognised by its bytes and folded without a decode.
	pending atomic.Pointer[pendingWrite]
}

type pendingWrite struct {
	value []byte
	rec   *progressRecord
}

// tenancy is one split this worker holds. Its lease revision and last
// renewal live with the renewer.
type tenancy struct {
	epoch uint64
	// releasing: an atomic release (releaseAtomic) is in flight. Its lease
	// delete lands with the owner-clear, so the watches may show the lease
	// gone, or a peer's claim after it, before the release's answer is
	// folded; that answer, not those events, decides how the tenancy ends,
	// so dropLost waits for it.
	releasing bool
}

// source says where a value folded into the view comes from.
type source struct {
	read  bool   // read from the store (a listing, snapshot or get), not a live event
	since uint64 // the loop clock when that read started
}

// live is a watch event or the result of this worker's own write: at or
// below the revision held it is a stale echo.
var live = source{}

// readSince is a value read from the store by a read that started at mark.
func readSince(mark uint64) source { return source{read: true, since: mark} }

// mark starts a read of the store: values set after it are newer than
// anything the read can return.
func (j *jobView) mark() uint64 {
	j.clock++
	return j.clock
}

// view is split id's view, made empty when the job view has none.
func (j *jobView) view(id string) *splitView {
	v := j.splits[id]
	if v == nil {
		v = &splitView{}
		j.splits[id] = v
	}
	return v
}

// leaseSeed keys leaseHash with a per-process random seed, so no record
// can be crafted to collide with another.
var leaseSeed = maphash.MakeSeed()

// leaseHash identifies a lease value by a 64-bit keyed hash of its bytes.
// The view keeps it instead of the bytes (8 bytes per split rather than
// about 80): two different values colliding is a 2^-64 chance per
// comparison.
func leaseHash(value []byte) uint64 { return maphash.Bytes(leaseSeed, value) }

// ----- durable keys ------------------------------------------------------------

// errNamespaceGone is the Fatal error of a job whose plan record vanished
// under a running worker: the store lost or dropped the job's records, and
// nothing it still holds can be trusted to resume from.
func errNamespaceGone(how string) error {
	return Fatalf("the job's records are gone from the store (%s). Likely causes: the store was wiped (Redis FLUSHALL/FLUSHDB, a key eviction policy other than noeviction), "+
		"restarted without persistence (Redis without appendonly), restored from an older backup, or the job was deleted. "+
		"The committed progress cannot be trusted: check the store, then restore it from a backup or start the job anew (it replays from the beginning)", how)
}

// completed reports whether the view holds split id's record completed.
func (a *actor) completed(id string) bool {
	v := a.job.splits[id]
	return v != nil && v.prog != nil && v.prog.Status == statusCompleted
}

// upsert folds a progress record into the view: the only place progress
// state changes.
//
// A live value at or below the held revision is a stale echo. A value read
// from the store with a revision below the one held means the store went
// back in time — a crashed server that lost writes readers had already
// seen (Redis reads see a write before its AOF fsync) — and the view adopts
// what the store now says rather than filter every later write as stale;
// but only if nothing changed the view since that read started (else the
// read is merely older than what the view holds).
func (a *actor) upsert(id string, r *progressRecord, rev uint64, src source) {
	v := a.job.view(id)
	if rev <= v.progRev {
		if !src.read || rev == v.progRev || v.progAt >= src.since {
			return
		}
		a.log.Warn("the store went back in time: a split record's revision is below one seen before; adopting the store's state",
			"split", id, "seen", v.progRev, "now", rev)
	}
	prev, back := v.prog, rev < v.progRev
	a.job.durableSeq++
	delete(a.records.missing, id)
	if prev == nil {
		a.job.nSplits++
		a.dirty = true
	} else {
		if prev.owner() != r.owner() || prev.Status != r.Status || prev.Parked != r.Parked {
			a.dirty = true // a parked split frees a lane for the assignment
		}
		a.job.count(prev.Status, -1)
	}
	a.job.count(r.Status, +1)
	v.prog, v.progRev, v.progAt = r, rev, a.job.clock
	a.job.noteChildren(id, r)
	a.worker.touch(id)
	a.io.cellSaw(id, r, rev, back)
	if t, held := a.worker.owned[id]; held && r.Epoch > t.epoch {
		a.dropLost(id, "fenced", fmt.Sprintf("a claimant fenced it at epoch %d", r.Epoch))
	}
	// Emit Quarantined once per transition this worker observes (a snapshot
	// of an already quarantined split is no transition).
	if r.Status == statusQuarant && prev != nil && prev.Status != statusQuarant {
		a.c.emit(Quarantined{Split: SplitID{id: id}, Attempts: r.Attempts})
		a.log.Warn("split quarantined: out of delivery attempts; it blocks completion", "split", id, "attempts", r.Attempts)
	}
	if r.Status == statusRunnable && int(r.Attempts)+1 >= a.cfg.MaxAttempts {
		a.worker.quarantineScan = true
	}
	if r.Status == statusRunnable && prev != nil && prev.Status == statusQuarant {
		if a.verdicts.withdrawStall() {
			a.dirty = true
			a.log.Info("stall withdrawn: a quarantined split is runnable again", "split", id)
		}
	}
}

// forgetProgress takes a split whose progress record is gone from the
// view: a tenancy of it here is lost, and the leader restores the record
// (restoreMissing) from the last state the view held, so the job neither
// hangs on a planned split without a record nor loses what it committed.
//
// rev is the delete's revision when a watch event carried one (0 for an
// absence from a listing): the view then holds it as the record's last
// revision, so no value older than the delete brings the record back.
func (a *actor) forgetProgress(id string, rev uint64) {
	v := a.job.splits[id]
	if v == nil || v.prog == nil {
		return
	}
	if _, held := a.worker.owned[id]; held {
		a.dropLost(id, "fenced", "its progress record was deleted")
	}
	a.worker.touch(id)
	a.job.count(v.prog.Status, -1)
	a.job.nSplits--
	a.records.missing[id] = v.prog
	v.prog, v.progAt = nil, a.job.clock
	v.progRev = max(v.progRev, rev)
	a.dirty = true
}

func (j *jobView) count(status string, d int) {
	switch status {
	case statusCompleted:
		j.nCompleted += d
	case statusQuarant:
		j.nQuarant += d
	}
}
