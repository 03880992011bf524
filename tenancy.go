package spate

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"
)

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

// worker is this process's side of the job: the splits it holds, the claims
// and hand-backs in flight, and the leader's instruction to it. The loop
// owns it; the renewer keeps the held splits' leases beside the loop.
type worker struct {
	owned       map[string]*tenancy
	claiming    int               // claims in flight
	handingBack map[string]int    // splits a release command is handing back
	undrained   int               // release commands (not drained hand-backs) in flight: no claims meanwhile
	selfFenced  map[string]uint64 // splits this process self-fenced, at their epoch

	assigned   map[string]bool      // the leader's instruction: the splits to hold
	assignSeen bool                 // an instruction was read (assigned means something)
	assignGen  uint64               // the instruction's plan generation
	awaiting   map[string]time.Time // assigned and not yet held, since when

	revocations revocationSet // held splits the leader moved away (revocation.go)
	asks        workerAsks    // the leader's asks to divide held splits (autodivide.go)
	parting     bool          // the worker is departing: it claims nothing more

	ownDirty       bool // something the own-split reconcile reads changed
	quarantineScan bool // a held or assigned split may be due for quarantine
}

func newWorker(m *coordMetrics, log *slog.Logger) worker {
	return worker{
		owned:       map[string]*tenancy{},
		handingBack: map[string]int{},
		selfFenced:  map[string]uint64{},
		assigned:    map[string]bool{},
		awaiting:    map[string]time.Time{},
		revocations: newRevocationSet(m, log),
	}
}

// inScope reports whether split id concerns this worker: assigned to it,
// being handed back by it, or held. A scoped worker watches exactly these
// splits' keys.
func (wk *worker) inScope(id string) bool {
	if wk.assigned[id] || wk.handingBack[id] > 0 {
		return true
	}
	_, held := wk.owned[id]
	return held
}

// adopt replaces the worker's instruction with val, read at now. It
// refuses (false) an instruction of an older generation than the one
// adopted: a deposed leader's late write must not walk it backwards.
func (wk *worker) adopt(val *assignmentVal, now time.Time) bool {
	if wk.assignSeen && val.Generation < wk.assignGen {
		return false
	}
	wk.assignGen = val.Generation
	wk.assignSeen = true
	wk.asks.adopt(val.Divide)
	wk.ownDirty = true
	next := make(map[string]bool, len(val.Splits))
	for _, id := range val.Splits {
		next[id] = true
		if _, held := wk.owned[id]; !held {
			if _, ok := wk.awaiting[id]; !ok {
				wk.awaiting[id] = now
			}
		}
	}
	for id := range wk.awaiting {
		if !next[id] {
			delete(wk.awaiting, id)
		}
	}
	wk.assigned = next
	return true
}

// withdrawRevocations cancels the revocations of held splits the leader
// named here again.
func (wk *worker) withdrawRevocations(now time.Time) {
	for id := range wk.revocations.byID {
		if _, held := wk.owned[id]; held && wk.assigned[id] {
			wk.revocations.withdraw(id, now)
		}
	}
}

// forget drops the instruction (its record was deleted or left the view).
func (wk *worker) forget() {
	wk.assignSeen = false
	wk.ownDirty = true
	wk.assigned = map[string]bool{}
	clear(wk.awaiting)
}

// ----- the worker's transitions, called by claims.go and release.go -------------

// claimStarted and claimEnded count the claims in flight.
func (wk *worker) claimStarted() { wk.claiming++ }
func (wk *worker) claimEnded()   { wk.claiming-- }

// gain takes a won claim: split id is held under t, and a self-fence of
// it (which made this claim attempt-free) is forgotten.
func (wk *worker) gain(id string, t *tenancy) {
	wk.owned[id] = t
	delete(wk.selfFenced, id)
}

// arrived takes split id off the splits awaiting their claim since they
// were assigned, and says since when it waited.
func (wk *worker) arrived(id string) (since time.Time, ok bool) {
	since, ok = wk.awaiting[id]
	if ok {
		delete(wk.awaiting, id)
	}
	return since, ok
}

// handBack notes a release handing split id back: nothing re-claims it
// meanwhile. handedBack ends one, and reports whether none is left.
func (wk *worker) handBack(id string) { wk.handingBack[id]++ }

func (wk *worker) handedBack(id string) bool {
	if wk.handingBack[id]--; wk.handingBack[id] <= 0 {
		delete(wk.handingBack, id)
		return true
	}
	return false
}

// undrainedRelease counts release commands (not drained hand-backs) in
// flight, d being +1 or -1: no claims meanwhile.
func (wk *worker) undrainedRelease(d int) { wk.undrained += d }

// part marks the worker leaving the fleet, and reports whether it was not
// already: no claims from now on, and no split awaits a claim.
func (wk *worker) part() bool {
	if wk.parting {
		return false
	}
	wk.parting = true
	clear(wk.awaiting)
	return true
}

// The end of a tenancy, on the loop: leave when the worker ends it itself
// (its own write decides the record), dropLost when it is taken from it.

// leave takes a split out of the owned set and stops renewing its lease;
// it returns the lease's last revision.
func (a *actor) leave(id string) uint64 {
	delete(a.worker.owned, id)
	a.w.scopeDirty = true
	a.io.closeCell(id)
	return a.renew.release(id)
}

// dropLost ends a tenancy involuntarily: it leaves the durable record and
// the lease alone, settles any revocation as forced and emits Lost.
func (a *actor) dropLost(id, reason, why string) {
	t, held := a.worker.owned[id]
	if !held {
		return
	}
	if t.releasing {
		a.log.Debug("split release in flight; its answer decides whether it was lost", "split", id, "reason", reason, "why", why)
		return
	}
	a.leave(id)
	if reason == "starved" {
		// Decision: a self-fence is always forgiven (this process's next
		// claim of the split is attempt-free). Renewals run on their own
		// goroutine, beside the loop and the source, so no split can starve
		// them: a self-fence is evidence about the store, never the split.
		a.worker.selfFenced[id] = t.epoch
	}
	a.worker.revocations.settle(id, "forced")
	a.m.losses.WithLabelValues(reason).Inc()
	a.log.Warn("split lost", "split", id, "reason", reason, "why", why)
	a.c.emit(Lost{Split: SplitID{id: id}})
}

// committed takes a won (or landed) commit of the tenancy t: the
// revocation it answers progressed, the record goes to the split table
// (upsert, which tells the owners that hang on it), and a completed
// split's tenancy ends here, its lease deleted beside the loop.
func (a *actor) committed(id string, t *tenancy, rec *progressRecord, rev uint64) {
	a.worker.revocations.progressed(id, time.Now())
	a.upsert(id, rec, rev, live)
	if rec.Completed {
		if t2, ok := a.worker.owned[id]; ok && t2 == t {
			leaseRev := a.leave(id)
			a.worker.revocations.settle(id, "drained")
			a.dropLeaseAsync(id, leaseRev, t.epoch)
		}
	}
}

// deleteOwnLease deletes a lease this process wrote for the tenancy at
// epoch, guarded by its revision; if a renewal moved the revision in the
// meantime, it re-reads the key and deletes it only if it is still ours.
// Best effort: what it leaves behind expires. It reports whether the key
// is gone and at which revision it was deleted.
func deleteOwnLease(ctx context.Context, st Store, id string, rev uint64, self, nonce string, epoch uint64) (uint64, bool) {
	if rev == 0 {
		return 0, false
	}
	key := prefixSplit + id
	for range 2 {
		o, err := st.Delete(ctx, Ephemeral, key, rev)
		if err != nil {
			return 0, false
		}
		if o.Won {
			return rev, true
		}
		e, ok, err := st.Get(ctx, Ephemeral, key)
		if err != nil || !ok {
			return 0, false
		}
		l, err := decodeLease(key, e.Value)
		if err != nil || l.Owner != self || l.Nonce != nonce || l.Epoch != epoch {
			return 0, false
		}
		rev = e.Revision
	}
	return 0, false
}

// dropLeaseAsync deletes our lease beside the loop after the tenancy ended;
// a delete that lands clears the lease from the view at once, so the next
// claim scan does not mistake it for a live one.
func (a *actor) dropLeaseAsync(id string, rev, epoch uint64) {
	if rev == 0 {
		return
	}
	a.spawn(func(ctx context.Context) func() error {
		drev, ok := deleteOwnLease(ctx, a.st, id, rev, a.self, a.nonce, epoch)
		if !ok {
			a.log.Debug("lease delete did not land; it will expire", "split", id)
			return nil
		}
		return func() error {
			if v := a.job.splits[id]; v != nil && v.lease != nil && v.leaseRev == drev {
				v.lease = nil
				a.dirty = true
			}
			return nil
		}
	})
}

// touch notes that a split's view changed: if it concerns this worker (it
// holds the split or is assigned it), the next step re-runs the own-split
// reconcile. A change to anyone else's split costs no step work.
func (wk *worker) touch(id string) {
	if wk.assigned[id] {
		wk.ownDirty = true
	} else if _, held := wk.owned[id]; held {
		wk.ownDirty = true
	}
}

// ----- progress records: folded by the tenancy -------------------------------

// upsert folds a progress record into the split table (foldProgress)
// and tells the owners whose state hangs on it: damage (a record seen
// again is no longer missing), division (children created), the
// tenancy (touched; fenced by a claimant's epoch: Lost), the commit
// fences, and the terminal verdict (a stall withdrawn).
func (a *actor) upsert(id string, r *progressRecord, rev uint64, src source) {
	prev, back, ok := a.job.foldProgress(id, r, rev, src, a.log)
	if !ok {
		return
	}
	a.records.found(id)
	if prev == nil || prev.owner() != r.owner() || prev.Status != r.Status || prev.Parked != r.Parked {
		a.dirty = true // a parked split frees a lane for the assignment
	}
	a.division.noteChildren(id, r)
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
		a.worker.scanForQuarantine()
	}
	if r.Status == statusRunnable && prev != nil && prev.Status == statusQuarant {
		if a.verdicts.withdrawStall() {
			a.dirty = true
			a.log.Info("stall withdrawn: a quarantined split is runnable again", "split", id)
		}
	}
}

// ----- leases: folded by the tenancy -------------------------------------------

// leasePut folds a put of a split's lease at rev: a lease of another
// process on a split this worker holds ends its tenancy (Lost).
func (a *actor) leasePut(key string, value []byte, rev uint64) error {
	id := key[len(prefixSplit):]
	v := a.job.view(id)
	if rev <= v.leaseRev {
		return nil
	}
	if v.lease != nil && leaseHash(value) == v.leaseSum {
		// A heartbeat: same holder, same tenancy, a later revision.
		// Nothing to decide, nothing to decode.
		v.leaseRev, v.leaseAt = rev, a.job.clock
		return nil
	}
	a.worker.touch(id)
	l, err := decodeLease(key, value)
	if err != nil {
		return err
	}
	if _, held := a.worker.owned[id]; held && l.Nonce != a.nonce {
		if l.Owner == a.self {
			// Another live process with our instance id took it. Which
			// of the two stops is the presence record's call (the
			// older one); here the split is simply lost.
			a.dropLost(id, "fenced", "its lease was taken by another process with this instance id")
			a.renew.checkPresence()
		} else {
			a.dropLost(id, "fenced", "its lease was taken by "+l.Owner)
		}
	}
	if v.lease == nil || v.lease.Owner != l.Owner {
		a.dirty = true
	}
	v.lease, v.leaseSum, v.leaseRev, v.leaseAt = l, leaseHash(value), rev, a.job.clock
	return nil
}

// leaseDelete folds a delete of split id's lease at rev (or, with force,
// its authoritative absence from a read, without a revision check): a
// tenancy here whose lease expired is lost.
func (a *actor) leaseDelete(id string, rev uint64, force bool) {
	v := a.job.view(id)
	if !force && rev <= v.leaseRev {
		return
	}
	if _, held := a.worker.owned[id]; held && (force || rev > a.renew.leaseRev(id)) {
		a.dropLost(id, "starved", "its lease expired: renewals failed for a whole lease")
	}
	if v.lease != nil {
		a.dirty = true
	}
	a.worker.touch(id)
	v.lease, v.leaseSum, v.leaseAt, v.leaseGoneAt = nil, 0, a.job.clock, time.Time{}
	if !force {
		v.leaseRev, v.leaseGoneAt = rev, time.Now()
	}
	if p := v.prog; p != nil && p.Status == statusRunnable && int(p.Attempts)+1 >= a.cfg.MaxAttempts {
		a.worker.scanForQuarantine()
	}
}

// scanForQuarantine makes the next reconcileOwn scan the assigned splits
// for quarantine even with every lane busy: one of them may be out of
// attempts.
func (w *worker) scanForQuarantine() { w.quarantineScan = true }

// quarantineScanned notes that reconcileOwn's scan began.
func (w *worker) quarantineScanned() { w.quarantineScan = false }

// leaseSweep applies a complete read of the ephemeral keyspace that
// started at mark: a lease seen before mark that the read does not list
// is gone.
func (a *actor) leaseSweep(listed map[string]bool, mark uint64) {
	for _, id := range slices.Sorted(maps.Keys(a.job.splits)) {
		if !listed[prefixSplit+id] {
			a.leaseAbsent(id, mark)
		}
	}
}

// leaseAbsent applies the absence of split id's lease from a complete
// read that started at mark.
func (a *actor) leaseAbsent(id string, mark uint64) {
	if v := a.job.splits[id]; v != nil && v.lease != nil && v.leaseAt < mark {
		a.leaseDelete(id, 0, true)
	}
}
