package spate

import (
	"errors"
	"maps"
	"slices"
	"strings"
)

// Damaged records.
//
// A split's progress or spec record that cannot be read (corrupt bytes, an
// unknown schema, an id that does not match its key, another job's
// fingerprint) takes only that split out of play: a tenancy of it here is
// lost, it is neither assigned nor claimed, it blocks completion, and the
// job ends Stalled naming it while every other split runs to its end. The
// record is left as it is, for the operator: a readable value written
// over it, or its deletion, puts the split back in play (a deleted
// progress record is restored from the last state seen, or re-seeded from
// its spec). Decision: one bad record must not stop a fleet that has
// thousands of good ones; stopping every worker (as a Fatal error did)
// turned a one-key repair into an outage.

// damagedRecord is one record of the view that cannot be read.
type damagedRecord struct {
	id   string
	key  string
	err  error
	last *progressRecord // the split's last readable progress, if the view held one
	at   uint64          // loop clock when it was last seen damaged
}

// isDamage reports whether err says a record cannot be read.
func isDamage(err error) bool { return errors.Is(err, ErrUnreadableRecord) }

// damageFix is what an operator can do about a damaged record.
func damageFix(key string) string {
	if strings.HasPrefix(key, prefixSpec) {
		return "restore the key from a backup; deleting it leaves the split without a descriptor until a planner run re-seeds it"
	}
	return "delete the key (the leader restores the split from the last state seen, or re-seeds it from its spec and it replays from its start), or restore it from a backup"
}

// readable folds the outcome of decoding key, one of split id's records
// read at rev: a record that cannot be read damages the split and is no
// error of the loop's, a readable one repairs it. ok says the decoded
// record may be folded; err is an error of any other kind.
func (a *actor) readable(id, key string, rev uint64, decodeErr error) (ok bool, err error) {
	switch {
	case decodeErr == nil:
		a.repair(key, false)
		return true, nil
	case isDamage(decodeErr):
		a.damage(id, key, rev, decodeErr)
		return false, nil
	}
	return false, decodeErr
}

// damage takes split id out of play because key, one of its records,
// cannot be read (err); rev is the damaged value's revision (0 if unknown).
func (a *actor) damage(id, key string, rev uint64, err error) {
	d, seen := a.records.damaged[key]
	if !seen {
		d = &damagedRecord{id: id, key: key}
		a.records.damaged[key] = d
	}
	d.err, d.at = err, a.job.clock
	v := a.job.view(id)
	if key == prefixSplit+id {
		if _, held := a.worker.owned[id]; held && v.prog != nil {
			a.dropLost(id, "damaged", "its progress record became unreadable")
		}
		if last := a.job.dropUnreadable(id, rev); last != nil {
			d.last = last
		}
		if m := a.records.missing[id]; m != nil {
			if d.last == nil {
				d.last = m
			}
			delete(a.records.missing, id) // the key exists: nothing to restore
		}
	}
	a.job.durableChanged()
	a.dirty = true
	if !seen {
		a.m.damaged.Set(float64(len(a.records.damaged)))
		a.log.Error("a record of the job is unreadable; its split is out of play until the record is fixed, the rest of the job runs",
			"split", id, "key", key, "err", err, "fix", damageFix(key))
	}
}

// repair puts key's split back in play: a readable value arrived for it
// (the caller folds it next) or it was deleted (deleted says so).
func (a *actor) repair(key string, deleted bool) {
	d, ok := a.records.damaged[key]
	if !ok {
		return
	}
	delete(a.records.damaged, key)
	a.m.damaged.Set(float64(len(a.records.damaged)))
	a.job.durableChanged()
	a.dirty = true
	if deleted && key == prefixSplit+d.id && d.last != nil {
		a.records.missing[d.id] = d.last // the leader restores it (restoreMissing)
	}
	a.log.Info("a damaged record was repaired; its split is back in play", "split", d.id, "key", key, "deleted", deleted)
}

// recordState is what the view knows of records that are not there to be
// read: unreadable ones, by key, and progress records deleted from outside
// the coordinator, as last seen.
type recordState struct {
	damaged map[string]*damagedRecord  // unreadable records by key
	missing map[string]*progressRecord // deleted progress records, by split id, for the leader to restore
}

// splitDamaged reports whether one of split id's records is damaged.
func (r *recordState) splitDamaged(id string) bool {
	if len(r.damaged) == 0 {
		return false
	}
	return r.damaged[prefixSplit+id] != nil || r.damaged[prefixSpec+id] != nil
}

// damagedSplits is the sorted ids of the splits out of play.
func (r *recordState) damagedSplits() []string {
	ids := map[string]bool{}
	for _, d := range r.damaged {
		ids[d.id] = true
	}
	return slices.Sorted(maps.Keys(ids))
}

// damagedKeys is the sorted keys of the damaged records.
func (r *recordState) damagedKeys() []string { return slices.Sorted(maps.Keys(r.damaged)) }

// keepOnly forgets the damage of every split keep refuses, and every
// missing record (the leader restores those; a scoped worker is not it).
// It returns how many damaged records are left.
func (r *recordState) keepOnly(keep func(id string) bool) (damaged int) {
	for key, d := range r.damaged {
		if !keep(d.id) {
			delete(r.damaged, key)
		}
	}
	clear(r.missing)
	return len(r.damaged)
}

// damagedBefore reports whether key is damaged as last seen before loop
// clock mark.
func (r *recordState) damagedBefore(key string, mark uint64) bool {
	d := r.damaged[key]
	return d != nil && d.at < mark
}

// found notes that split id's progress record is in the view again:
// there is nothing to restore.
func (r *recordState) found(id string) { delete(r.missing, id) }

// lost notes that split id's progress record is missing from the store;
// the leader restores last (restoreMissing).
func (r *recordState) lost(id string, last *progressRecord) { r.missing[id] = last }
