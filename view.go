package spate

import (
	"hash/maphash"
	"log/slog"
	"sync/atomic"
	"time"
)

// jobView is this worker's split table, folded from watch events,
// listings, re-reads and the results of its own writes (foldProgress is
// the only place a split's progress state changes), and the loop clock.
// Every value carries the store revision it was read at; the loop clock
// orders reads against changes (see mark). The other record kinds are
// folded by their owners (route.go says which).
type jobView struct {
	splits     map[string]*splitView
	nSplits    int // splits with a progress record
	nCompleted int
	nQuarant   int
	durableSeq uint64 // bumps on every durable change (gates terminal listing)
	clock      uint64 // bumps when a read of the store starts (see mark)
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

// completed reports whether the view holds split id's record completed.
func (a *actor) completed(id string) bool {
	v := a.job.splits[id]
	return v != nil && v.prog != nil && v.prog.Status == statusCompleted
}

// foldProgress folds a progress record into the split table: the only
// place progress state changes. It returns the record it replaced (prev)
// and whether the store went back in time (back); ok is false when the
// record changes nothing (a stale echo).
//
// A live value at or below the held revision is a stale echo. A value read
// from the store with a revision below the one held means the store went
// back in time — a crashed server that lost writes readers had already
// seen (Redis reads see a write before its AOF fsync) — and the view adopts
// what the store now says rather than filter every later write as stale;
// but only if nothing changed the view since that read started (else the
// read is merely older than what the view holds).
func (j *jobView) foldProgress(id string, r *progressRecord, rev uint64, src source, log *slog.Logger) (prev *progressRecord, back, ok bool) {
	v := j.view(id)
	if rev <= v.progRev {
		if !src.read || rev == v.progRev || v.progAt >= src.since {
			return nil, false, false
		}
		log.Warn("the store went back in time: a split record's revision is below one seen before; adopting the store's state",
			"split", id, "seen", v.progRev, "now", rev)
	}
	prev, back = v.prog, rev < v.progRev
	j.durableSeq++
	if prev == nil {
		j.nSplits++
	} else {
		j.count(prev.Status, -1)
	}
	j.count(r.Status, +1)
	v.prog, v.progRev, v.progAt = r, rev, j.clock
	return prev, back, true
}

// dropProgress takes split id's progress record out of the split table
// and returns it (nil: the table held none). rev is the delete's revision
// when a watch event carried one (0 for an absence from a listing): the
// table then holds it as the record's last revision, so no value older
// than the delete brings the record back.
func (j *jobView) dropProgress(id string, rev uint64) *progressRecord {
	v := j.splits[id]
	if v == nil || v.prog == nil {
		return nil
	}
	old := v.prog
	j.count(old.Status, -1)
	j.nSplits--
	v.prog, v.progAt = nil, j.clock
	v.progRev = max(v.progRev, rev)
	return old
}

// terminalCounts is how many splits of the view are completed and how
// many quarantined.
func (j *jobView) terminalCounts() (completed, quarantined int) { return j.nCompleted, j.nQuarant }

func (j *jobView) count(status string, d int) {
	switch status {
	case statusCompleted:
		j.nCompleted += d
	case statusQuarant:
		j.nQuarant += d
	}
}

// keepOnly drops from the split table every split keep refuses (a scoped
// worker forgets what it no longer watches).
func (j *jobView) keepOnly(keep func(id string) bool) {
	for id, v := range j.splits {
		if keep(id) {
			continue
		}
		if v.prog != nil {
			j.count(v.prog.Status, -1)
			j.nSplits--
		}
		delete(j.splits, id)
	}
}

// dropPruned takes a pruned split's records out of the table (its entry
// stays only while a lease of it is live); rev is as for dropProgress. It
// reports whether the table held the split.
func (j *jobView) dropPruned(id string, rev uint64) bool {
	v := j.splits[id]
	if v == nil {
		return false
	}
	if v.prog != nil {
		j.count(v.prog.Status, -1)
		j.nSplits--
	}
	j.durableSeq++
	v.prog, v.spec, v.progAt = nil, nil, j.clock
	v.progRev = max(v.progRev, rev)
	if v.lease == nil {
		delete(j.splits, id)
	}
	return true
}

// durableChanged notes a change of the durable keyspace as the view holds
// it (durableSeq gates the terminal listing).
func (j *jobView) durableChanged() { j.durableSeq++ }

// dropUnreadable takes split id's progress record out of the table when
// the record became unreadable at rev (0 if unknown), and returns the
// last one it held (nil: none). The table holds rev as the record's last
// revision, so no older value brings the record back.
func (j *jobView) dropUnreadable(id string, rev uint64) (last *progressRecord) {
	v := j.view(id)
	if v.prog != nil {
		j.count(v.prog.Status, -1)
		j.nSplits--
		last, v.prog = v.prog, nil
	}
	if rev > v.progRev {
		v.progRev, v.progAt = rev, j.clock
	}
	return last
}

// forgetSpec drops split id's spec from the table: a completed split's
// spec goes first when it is pruned (prune.go). The table must hold id.
func (j *jobView) forgetSpec(id string) { j.splits[id].spec = nil }
