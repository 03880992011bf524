package spate

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// leaderState is this worker's part in leading the job: the term it leads
// (if any), an election in flight, and the term's assignment publishing.
type leaderState struct {
	term     *leadership   // the term this worker leads; nil: it does not lead
	electing bool          // an election attempt is in flight
	pub      publishState  // the assignment publishing of the term (publish.go)
	div      divideTrigger // the division trigger (autodivide.go)

	// key is the leader key as this worker last saw it, whoever holds it
	// (nil: absent), at revision keyRev, set at loop clock keyAt. Only
	// the leader key's events (leaderKeyPut, leaderKeyDelete) and a won
	// election write it.
	key    *leaderVal
	keyRev uint64
	keyAt  uint64
}

// leaderKeyPut folds a put of the leader key at rev: a key of another
// process ends this worker's term.
func (a *actor) leaderKeyPut(value []byte, rev uint64) error {
	if rev <= a.leader.keyRev {
		return nil
	}
	l, err := decodeLeader(value)
	if err != nil {
		return err
	}
	a.leader.key, a.leader.keyRev, a.leader.keyAt = l, rev, a.job.clock
	if a.leader.term != nil && l.Nonce != a.nonce {
		a.demote("the leader key now belongs to " + l.Owner)
	}
	return nil
}

// leaderKeyDelete folds a delete of the leader key at rev (or, with
// force, its authoritative absence from a read, without a revision
// check): this worker's term ends unless the delete is older than its
// own key.
func (a *actor) leaderKeyDelete(rev uint64, force bool) {
	if !force && rev <= a.leader.keyRev {
		return
	}
	a.leader.key, a.leader.keyAt = nil, a.job.clock
	if !force {
		a.leader.keyRev = rev
	}
	if a.leader.term != nil && (force || rev > a.renew.leaderRev()) {
		a.log.Warn("leadership lease expired")
		a.dropLeadership()
	}
}

// leaderKeyAbsent applies the leader key's absence from a complete read
// that started at mark: a key seen before mark is gone.
func (a *actor) leaderKeyAbsent(mark uint64) {
	if a.leader.key != nil && a.leader.keyAt < mark {
		a.leaderKeyDelete(0, true)
	}
}

// leadership is this worker's tenure as the planner leader. The leader
// key's revision lives with the renewer, which keeps it alive.
type leadership struct {
	generation  uint64    // the plan generation we lead under
	settleUntil time.Time // no assignment before this (a new job's start)
	settleCap   time.Time // the settle window never runs past this
}

// memberArrived extends a new job's settle window: the first assignment
// waits until membership has been quiet for settleQuiet, at most until
// the cap (a third of the lease after the election).
func (l *leadership) memberArrived(now time.Time, quiet time.Duration) {
	if now.Before(l.settleCap) {
		l.settleUntil = minTime(now.Add(quiet), l.settleCap)
	}
}

func minTime(x, y time.Time) time.Time {
	if x.Before(y) {
		return x
	}
	return y
}

// ----- election ------------------------------------------------------------------

// electResult is what an election attempt learned.
type electResult struct {
	won       bool
	leaderRev uint64
	val       leaderVal
	plan      *planRecord // the plan as the attempt last saw or wrote it
	planRev   uint64
	bumped    bool   // the generation fence is ours
	demote    string // why the won key must be given up again
	err       error  // Fatal
	failed    bool   // a store error: retry later
}

// elect tries, beside the loop, to take the leader key and fence the plan
// generation past its predecessor's.
func (a *actor) elect(now time.Time) {
	if a.planning.plan == nil || a.leader.electing {
		return
	}
	a.leader.electing = true
	snap, snapRev := *a.planning.plan, a.planning.planRev
	newJob := len(a.assigns.byInst) == 0 && a.planning.plan.Generation == 0
	a.spawn(func(ctx context.Context) func() error {
		res := a.runElection(ctx, snap, snapRev)
		return func() error {
			a.leader.electing = false
			return a.finishElection(res, newJob)
		}
	})
}

func (e *env) runElection(ctx context.Context, plan planRecord, planRev uint64) electResult {
	target := plan.Generation + 1
	val := leaderVal{Schema: SchemaVersion, Owner: e.self, Nonce: e.nonce, Generation: target}
	o, err := e.st.Create(ctx, Ephemeral, keyLeader, encode(val))
	if err != nil {
		e.log.Warn("election attempt failed", "err", err)
		return electResult{failed: true}
	}
	if !o.Won {
		return electResult{} // the watch will show the winner
	}
	res := electResult{won: true, leaderRev: o.Revision, val: val}
	// The planner fence: CAS the plan record to the new generation. A
	// racing successor that fenced past us makes us give up; after three
	// failed tries we give up rather than plan without a fence.
	for range 3 {
		if plan.Generation >= target {
			res.demote = fmt.Sprintf("a successor already holds generation %d", plan.Generation)
			return res
		}
		next := plan
		next.Generation = target
		next.UpdatedAtMs = nowMs()
		o, err := e.st.Update(ctx, Durable, keyPlan, encode(&next), planRev)
		if err != nil {
			if kindOf(err) == kindRetryable {
				continue
			}
			res.err = err
			return res
		}
		if o.Won {
			res.plan, res.planRev, res.bumped = &next, o.Revision, true
			return res
		}
		got, ok, err := e.st.Get(ctx, Durable, keyPlan)
		if err != nil {
			continue
		}
		if !ok {
			res.err = errNamespaceGone("the plan record vanished during an election")
			return res
		}
		p, err := decodePlan(keyPlan, got.Value, e.fp)
		if err != nil {
			res.err = err
			return res
		}
		if got.Revision > planRev {
			plan, planRev = *p, got.Revision
			res.plan, res.planRev = p, got.Revision
		}
	}
	res.demote = "could not fence the plan generation"
	return res
}

func (a *actor) finishElection(res electResult, newJob bool) error {
	if res.plan != nil {
		a.setPlan(res.plan, res.planRev)
	}
	if res.err != nil {
		return res.err
	}
	// A lost election backs off too: the winner's key normally reaches the
	// view through the watch and ends the attempts, but a worker whose
	// watch of the leader key is down (a scoped worker between two key
	// groups) would otherwise campaign again at once, and again, without
	// ever letting the loop wait (in a synctest bubble, virtual time then
	// never advanced: a chaos seed hung).
	if res.failed || !res.won || !res.bumped {
		a.failed(opKey{op: "elect"})
	}
	if !res.won {
		return nil
	}
	a.leader.key, a.leader.keyRev, a.leader.keyAt = &res.val, max(a.leader.keyRev, res.leaderRev), a.job.clock
	if !res.bumped || a.worker.parting || a.verdicts.terminal {
		switch {
		case res.demote != "":
			a.log.Warn("leadership given up at once", "why", res.demote)
		case a.worker.parting:
			// Leaving is not a loss (as in part).
			a.log.Info("leadership given up at once: this worker is leaving the fleet")
		default:
			a.log.Info("leadership given up at once: the job has ended")
		}
		a.deleteKey(Ephemeral, keyLeader, res.leaderRev)
		return nil
	}
	a.leader.term = &leadership{generation: res.val.Generation}
	a.renew.setLeader(res.leaderRev, res.val.Generation)
	if a.w.fullView {
		a.members.inferDeparted(a.job.splits, time.Now(), a.cfg.RebalanceDelay, a.log)
	}
	if newJob {
		// A brand-new job: workers usually start together. Let them
		// announce themselves before the first assignment, instead of
		// handing everything to the first and rebalancing it as each of
		// the others arrives (each move a drain): the first assignment
		// waits until membership has been quiet for settleQuiet (a quarter
		// second at most; each arrival starts it again), at most a third of
		// the lease.
		now := time.Now()
		a.leader.term.settleCap = now.Add(a.c.tm.settleCap)
		a.leader.term.settleUntil = minTime(now.Add(a.c.tm.settleQuiet), a.leader.term.settleCap)
	}
	a.dirty = true
	a.m.leader.Set(1)
	a.log.Info("elected planner leader", "generation", res.val.Generation)
	a.planning.elected() // a final plan is never re-run
	return nil
}

// demote gives leadership up: a guarded delete of the leader key (best
// effort, beside the loop).
func (a *actor) demote(why string) {
	if a.leader.term == nil {
		return
	}
	a.log.Warn("leadership lost", "why", why)
	a.resign()
}

// resign gives the leadership up and deletes the leader key, so that a
// peer is elected at once.
func (a *actor) resign() {
	rev := a.dropLeadership()
	a.deleteKey(Ephemeral, keyLeader, rev)
}

func (a *actor) dropLeadership() uint64 {
	a.leader.term = nil
	a.m.leader.Set(0)
	a.planning.stop()
	return a.renew.clearLeader()
}

// deleteKey is a best-effort guarded delete beside the loop: what it
// leaves behind expires or is cleaned up by its next owner.
func (a *actor) deleteKey(ks Keyspace, key string, rev uint64) {
	if rev == 0 {
		return
	}
	a.spawn(func(ctx context.Context) func() error {
		if _, err := a.st.Delete(ctx, ks, key, rev); err != nil {
			a.log.Debug("delete failed; the key will expire or be cleaned up", "key", key, "err", err)
		}
		return nil
	})
}

// publishConcurrency bounds the assignment writes in flight.
const publishConcurrency = 16

// publishPace bounds the share of the leader's loop that computing the
// assignment may take: after a computation that took d, the next starts
// no sooner than publishPace×d after it began, so at most about 1 in
// publishPace of the loop's time. The computation is O(splits); during
// placement every claim dirties it, and with no pacing a leader of
// 7,000 splits on etcd recomputed it after every batch of events, fell
// more than the watch buffer behind its whole-job watch and lost it three
// times in a row (each a re-read of the job), holding placement for 10 s.
// A small job's computation takes microseconds, so it is not delayed.
const publishPace = 10

// restoreMissing re-creates, create-if-absent, the progress records that
// were deleted externally, from the last state the view held: owner
// cleared and epoch bumped (a zombie's commit is fenced; the next claim is
// attempt-free), watermark and status kept (a completed split stays
// completed; a view older than the store's last commit costs a replay,
// never a loss).
func (a *actor) restoreMissing(now time.Time) {
	if len(a.records.missing) == 0 {
		return // the step's common case: nothing to sort
	}
	for _, id := range slices.Sorted(maps.Keys(a.records.missing)) {
		if a.io.busy[id] || !a.io.due(opKey{"restore", id}, now) {
			continue
		}
		rec := a.records.missing[id].clone()
		rec.Owner = nil
		rec.Epoch++
		rec.WrittenAtMs = nowMs()
		a.splitIO(id, func(ctx context.Context) func() error {
			o, err := a.st.Create(ctx, Durable, prefixSplit+id, encode(rec))
			return func() error {
				switch {
				case err != nil:
					a.failed(opKey{"restore", id})
				case o.Won:
					a.log.Warn("restored a deleted progress record from the last state seen", "split", id,
						"status", rec.Status, "epoch", rec.Epoch)
					a.upsert(id, rec, o.Revision, live)
				default:
					a.failed(opKey{"restore", id}) // someone re-created it: the watch brings it
				}
				return nil
			}
		})
	}
}
