package spate

import (
	"bytes"
	"strings"
)

// The view routes each record the watches, listings and re-reads deliver
// by its key's kind to the one owner of that kind, which folds it into
// its own state: the leader key to the leader (leader.go), presence to
// membership (members.go), leases to the tenancy (tenancy.go), the plan
// record to the planner (planner.go), assignment records to publishing
// (publish.go), the verdict record to the terminal verdict (terminal.go),
// split specs to the split table (view.go), and progress records to the
// tenancy (upsert, tenancy.go), which folds them into the split table and
// tells the owners that hang on them through narrow calls.

func (a *actor) ephemeralPut(key string, value []byte, rev uint64) error {
	switch {
	case key == keyLeader:
		return a.leaderKeyPut(value, rev)
	case strings.HasPrefix(key, prefixWorker):
		a.presencePut(key, value, rev)
	case strings.HasPrefix(key, prefixSplit):
		return a.leasePut(key, value, rev)
	}
	return nil
}

// ephemeralDelete applies a delete (or, with force, an authoritative
// absence from a listing, without a revision check).
func (a *actor) ephemeralDelete(key string, rev uint64, force bool) {
	switch {
	case key == keyLeader:
		a.leaderKeyDelete(rev, force)
	case strings.HasPrefix(key, prefixWorker):
		a.presenceDelete(key[len(prefixWorker):], rev, force)
	case strings.HasPrefix(key, prefixSplit):
		a.leaseDelete(key[len(prefixSplit):], rev, force)
	}
}

// applyEphemeral folds a complete read of the ephemeral keyspace (a watch
// snapshot or a listing) that started at mark: every key the view holds
// from before mark and the read does not list is gone.
func (a *actor) applyEphemeral(entries []Entry, mark uint64) error {
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		listed[e.Key] = true
	}
	if !listed[keyLeader] {
		a.leaderKeyAbsent(mark)
	}
	a.presenceSweep(listed, mark)
	a.leaseSweep(listed, mark)
	for _, e := range entries {
		if err := a.ephemeralPut(e.Key, e.Value, e.Revision); err != nil {
			return err
		}
	}
	return nil
}

// applyDurable folds a read of the durable keyspace that started at mark.
// With complete set, it is a whole-keyspace read: assignment records the
// view holds from before mark that it does not list are gone.
func (a *actor) applyDurable(entries []Entry, mark uint64, complete bool) error {
	if complete {
		listed := make(map[string]bool, len(entries))
		for _, e := range entries {
			listed[e.Key] = true
		}
		if !listed[keyPlan] {
			if err := a.planAbsent(mark, len(entries)); err != nil {
				return err
			}
		}
		for key, d := range a.records.damaged {
			if !listed[key] && d.at < mark {
				a.repair(key, true)
			}
		}
		for id, v := range a.job.splits {
			if v.prog != nil && !listed[prefixSplit+id] && v.progAt < mark {
				if pruned(v.prog, !listed[prefixSpec+id]) {
					a.forgetPruned(id, 0)
					continue
				}
				a.log.Warn("a split's progress record is missing from a listing; the leader restores it from the last state seen", "split", id)
				a.forgetProgress(id, 0)
			}
		}
		a.assignSweep(listed, mark)
	}
	for _, e := range entries {
		if err := a.durablePut(e.Key, e.Value, e.Revision, readSince(mark)); err != nil {
			return err
		}
	}
	return nil
}

func (a *actor) durablePut(key string, value []byte, rev uint64, src source) error {
	switch {
	case key == keyPlan:
		return a.planPut(key, value, rev)
	case strings.HasPrefix(key, prefixSpec):
		id := key[len(prefixSpec):]
		v := a.job.view(id)
		if v.spec != nil {
			return nil // immutable: the first copy wins
		}
		s, err := decodeSpec(key, id, value, a.fpHash)
		if ok, err := a.readable(id, key, rev, err); !ok {
			return err
		}
		v.spec = s
		if v.prog != nil {
			a.dirty = true
		}
		a.worker.touch(id)
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		if v := a.job.splits[id]; v != nil {
			if rev == v.progRev || rev < v.progRev && !src.read {
				return nil // an echo of what the view holds, or a stale one: skip the decode
			}
			if p := v.pending.Load(); p != nil && bytes.Equal(p.value, value) {
				a.upsert(id, p.rec, rev, src) // the echo of our commit in flight
				return nil
			}
		}
		r, err := decodeProgress(key, id, value, a.fpHash)
		if ok, err := a.readable(id, key, rev, err); !ok {
			return err
		}
		a.upsert(id, r, rev, src)
	case key == keyVerdict:
		return a.verdictPut(value, rev)
	case strings.HasPrefix(key, prefixAssign):
		a.assignPut(key, value, rev)
	}
	return nil
}

// durableDelete applies a watched delete at rev (0: revision unknown). A
// delete at or below the revision the view holds for a split record is
// stale: the record was re-created since (the leader restored it, and a
// re-read saw the new one before this event arrived), and forgetting it
// would leave the split without a record in this view for good, since
// the restored record's own event is then dropped as an echo.
func (a *actor) durableDelete(key string, rev uint64) error {
	a.job.durableChanged()
	switch {
	case key == keyPlan:
		return errNamespaceGone("its plan record was deleted")
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		if v := a.job.splits[id]; rev != 0 && v != nil && v.prog != nil && rev <= v.progRev {
			return nil // stale: the record was re-created since
		}
		if _, ok := a.records.damaged[key]; ok {
			a.repair(key, true)
			return nil
		}
		if v := a.job.splits[id]; v != nil && pruned(v.prog, v.spec == nil) {
			a.forgetPruned(id, rev)
			return nil
		}
		a.log.Warn("a split's progress record was deleted externally; the leader restores it from the last state seen", "key", key)
		a.forgetProgress(id, rev)
	case strings.HasPrefix(key, prefixSpec) && a.records.damaged[key] != nil:
		a.repair(key, true)
	case strings.HasPrefix(key, prefixSpec) && a.completed(key[len(prefixSpec):]):
		// A completed split's spec goes first when it is pruned (prune.go).
		a.job.forgetSpec(key[len(prefixSpec):])
	case key == keyVerdict:
		a.verdictDelete(rev)
	case strings.HasPrefix(key, prefixAssign):
		a.assignDelete(key[len(prefixAssign):])
	case strings.HasPrefix(key, prefixProbe):
		a.log.Debug("startup probe key cleared", "key", key)
	default:
		a.log.Warn("durable record deleted externally; reconcile treats it as absent", "key", key)
	}
	return nil
}

// errNamespaceGone is the Fatal error of a job whose plan record vanished
// under a running worker: the store lost or dropped the job's records, and
// nothing it still holds can be trusted to resume from.
func errNamespaceGone(how string) error {
	return Fatalf("the job's records are gone from the store (%s). Likely causes: the store was wiped (Redis FLUSHALL/FLUSHDB, a key eviction policy other than noeviction), "+
		"restarted without persistence (Redis without appendonly), restored from an older backup, or the job was deleted. "+
		"The committed progress cannot be trusted: check the store, then restore it from a backup or start the job anew (it replays from the beginning)", how)
}

// forgetProgress takes a split whose progress record is gone from the
// view: a tenancy of it here is lost, and the leader restores the record
// (restoreMissing) from the last state the view held, so the job neither
// hangs on a planned split without a record nor loses what it committed.
//
// rev is the delete's revision when a watch event carried one (0 for an
// absence from a listing): see dropProgress.
func (a *actor) forgetProgress(id string, rev uint64) {
	v := a.job.splits[id]
	if v == nil || v.prog == nil {
		return
	}
	if _, held := a.worker.owned[id]; held {
		a.dropLost(id, "fenced", "its progress record was deleted")
	}
	a.worker.touch(id)
	a.records.lost(id, a.job.dropProgress(id, rev))
	a.dirty = true
}
