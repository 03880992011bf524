package spate

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// step runs after every event, in this order: rebalance-delay windows,
// membership logs, then (unless a terminal verdict latched or the worker is
// parting) election, assignment publishing, reconciliation toward the own
// assignment, revocation deadlines, and terminal detection.
func (a *actor) step() error {
	now := time.Now()
	a.expireDeparted(now)
	a.logMembership()
	if a.terminal {
		a.gauges()
		return nil
	}
	if a.parting {
		err := a.detectTerminal()
		a.gauges()
		return err
	}
	if a.leaderObs == nil && a.leading == nil {
		if err := a.elect(); err != nil {
			return err
		}
	}
	if a.leading != nil {
		a.startPlan()
		if a.dirty && !now.Before(a.leading.settleUntil) {
			a.publish()
		}
	}
	if err := a.reconcileOwn(now); err != nil {
		return err
	}
	a.serviceRevocations(now)
	if err := a.detectTerminal(); err != nil {
		return err
	}
	a.gauges()
	return nil
}

func (a *actor) gauges() {
	a.m.splitsOwned.Set(float64(len(a.owned)))
	a.m.splitsCompleted.Set(float64(a.nCompleted))
	a.m.splitsQuarantined.Set(float64(a.nQuarant))
	live := len(a.presence)
	if _, ok := a.presence[a.self]; !ok && !a.parting {
		live++ // self always counts
	}
	a.m.liveWorkers.Set(float64(live))
	a.m.idle.Set(b2f(len(a.owned) == 0))
	a.m.splitsDraining.Set(float64(len(a.revocations)))
	a.m.leader.Set(b2f(a.leading != nil))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// expireDeparted ends rebalance-delay windows (on every worker: leadership
// can move).
func (a *actor) expireDeparted(now time.Time) {
	for inst, at := range a.departed {
		if a.cfg.RebalanceDelay == NoRebalanceDelay || now.Sub(at) >= a.cfg.RebalanceDelay {
			delete(a.departed, inst)
			a.dirty = true
		}
	}
}

// logMembership announces peers joining and leaving, diffed from the
// presence set so a re-snapshot does not re-announce everyone.
func (a *actor) logMembership() {
	if !a.joinLogged {
		return
	}
	for inst := range a.presence {
		if !a.loggedPeers[inst] {
			a.loggedPeers[inst] = true
			a.log.Info("peer joined", "peer", inst, "live", len(a.presence))
		}
	}
	for inst := range a.loggedPeers {
		if _, ok := a.presence[inst]; !ok && inst != a.self {
			delete(a.loggedPeers, inst)
			a.log.Info("peer left", "peer", inst, "live", len(a.presence))
		}
	}
}

// ----- leadership ---------------------------------------------------------

func (a *actor) elect() error {
	if a.plan == nil {
		return nil
	}
	target := a.plan.Generation + 1
	val := leaderVal{Schema: SchemaVersion, Owner: a.self, Nonce: a.nonce, Generation: target}
	o, err := a.st.Create(a.ctx, Ephemeral, keyLeader, encode(val))
	if err != nil {
		a.log.Warn("election attempt failed", "err", err)
		return nil
	}
	if !o.Won {
		return nil // the watch will show the winner
	}
	a.leading = &leadership{rev: o.Revision}
	if len(a.assigns) == 0 && a.plan.Generation == 0 {
		// A brand-new job: workers usually start together. Let them
		// announce themselves before the first assignment, instead of
		// handing everything to the first and rebalancing it as each of
		// the others arrives (each move a drain).
		a.leading.settleUntil = time.Now().Add(a.cfg.LeaseDuration / 3)
	}
	a.leaderObs, a.leaderRev = &val, max(a.leaderRev, o.Revision)
	a.dirty = true
	a.m.leader.Set(1)
	a.log.Info("elected planner leader", "generation", target)
	return a.bumpGeneration(target)
}

// bumpGeneration CAS-writes the plan record with the new generation: the
// planner fence. A racing successor that fenced past us demotes us; after
// three failed tries we demote rather than plan without a fence.
func (a *actor) bumpGeneration(target uint64) error {
	for range 3 {
		if a.leading == nil {
			return nil
		}
		if a.plan.Generation >= target {
			a.demote(fmt.Sprintf("a successor already holds generation %d", a.plan.Generation))
			return nil
		}
		next := *a.plan
		next.Generation = target
		next.UpdatedAtMs = nowMs()
		o, err := a.st.Update(a.ctx, Durable, keyPlan, encode(&next), a.planRev)
		if err != nil {
			if KindOf(err) == KindRetryable {
				continue
			}
			return err
		}
		if o.Won {
			a.plan, a.planRev = &next, o.Revision
			a.leading.generation = target
			// Decision: a final plan is never re-run. Final means the
			// enumeration is complete (and its publish proves the seeding
			// finished); re-running it could only add splits a final plan
			// must not grow by (a file rewritten since, say).
			a.planDue = next.Finality != finalityFinal
			return nil
		}
		e, ok, err := a.st.Get(a.ctx, Durable, keyPlan)
		if err != nil {
			continue
		}
		if !ok {
			return Fatalf("the plan record vanished mid-election; the job's namespace was tampered with")
		}
		p, err := decodePlan(keyPlan, e.Value, a.fp)
		if err != nil {
			return err
		}
		if e.Revision > a.planRev {
			a.plan, a.planRev = p, e.Revision
		}
	}
	a.demote("could not fence the plan generation")
	return nil
}

// ----- assignment publishing -------------------------------------------------

// publish computes the desired assignment and writes the records that
// changed. It runs only when an input changed (the dirty flag).
func (a *actor) publish() {
	a.dirty = false
	if a.plan == nil || len(a.presence) == 0 {
		return
	}
	reserved := map[string]bool{}
	if a.cfg.RebalanceDelay != NoRebalanceDelay && len(a.departed) > 0 {
		for id, v := range a.splits {
			if v.prog != nil {
				if _, gone := a.departed[v.prog.owner()]; gone {
					reserved[id] = true
				}
			}
		}
	}
	in := AssignInput{Seed: a.fpHash}
	for inst := range a.presence {
		budget := a.cfg.MaxInFlight
		if c, ok := a.caps[inst]; ok && c > 0 {
			budget = c
		}
		in.Members = append(in.Members, AssignMember{ID: inst, Budget: budget})
	}
	// A split with no owner right now may be in flight: handed back by a
	// revocation and not yet claimed by the member it was moved to. Keep it
	// with that member, or a recompute in between sends it somewhere else
	// (often straight back) and the move turns into ping-pong.
	named := map[string]string{}
	for inst, e := range a.assigns {
		if _, live := a.presence[inst]; live {
			for _, id := range e.val.Splits {
				named[id] = inst
			}
		}
	}
	for id, v := range a.splits {
		p := v.prog
		if p == nil || p.Status != statusRunnable || p.Completed || v.spec == nil || reserved[id] {
			continue
		}
		owner := p.owner()
		if v.lease != nil {
			owner = v.lease.Owner
		}
		if _, live := a.presence[owner]; !live && v.lease == nil {
			owner = named[id]
		}
		in.Splits = append(in.Splits, AssignSplit{ID: id, Weight: v.spec.Weight, Owner: owner})
	}
	result := Assign(in)

	// Previous assignee of each split, for the "moved" count: departed
	// instances' records first, then live members' override them.
	prev := map[string]string{}
	for _, live := range []bool{false, true} {
		for inst, e := range a.assigns {
			if _, present := a.presence[inst]; present == live {
				for _, id := range e.val.Splits {
					prev[id] = inst
				}
			}
		}
	}
	moved, changed := 0, false
	gen := a.leading.generation
	for _, inst := range slices.Sorted(maps.Keys(result)) {
		ids := result[inst]
		for _, id := range ids {
			if p, ok := prev[id]; ok && p != inst {
				moved++
			}
		}
		cached, ok := a.assigns[inst]
		if ok && cached.val.Generation == gen && slices.Equal(cached.val.Splits, ids) {
			continue // steady state writes nothing
		}
		val := &assignmentVal{Schema: SchemaVersion, Generation: gen, Splits: ids}
		var o Outcome
		var err error
		if ok {
			o, err = a.st.Update(a.ctx, Durable, prefixAssign+inst, encode(val), cached.rev)
		} else {
			o, err = a.st.Create(a.ctx, Durable, prefixAssign+inst, encode(val))
		}
		switch {
		case err != nil:
			a.log.Warn("assignment write failed; the next change or reconcile retries", "member", inst, "err", err)
		case !o.Won:
			delete(a.assigns, inst)
			a.dirty = true
		default:
			changed = true
			a.assigns[inst] = assignEntry{val: val, rev: o.Revision}
			if inst == a.self {
				a.adoptAssignment(val)
			}
		}
	}
	// Records of instances neither present nor inside a delay window go.
	for inst, e := range a.assigns {
		_, present := a.presence[inst]
		_, waiting := a.departed[inst]
		if !present && !waiting {
			if _, err := a.st.Delete(a.ctx, Durable, prefixAssign+inst, e.rev); err == nil {
				delete(a.assigns, inst)
				changed = true
			}
		}
	}
	if changed && moved > 0 {
		a.log.Info("assignment published", "members", len(result), "moved", moved, "generation", gen)
	}
}

// ----- reconciliation toward the own assignment ------------------------------

func (a *actor) claimInputs(all bool) []claimInput {
	ids := a.assigned
	if all {
		ids = make(map[string]bool, len(a.splits))
		for id := range a.splits {
			ids[id] = true
		}
	}
	out := make([]claimInput, 0, len(ids))
	for id := range ids {
		v := a.splits[id]
		if v == nil || v.prog == nil {
			continue
		}
		in := claimInput{id: id, status: v.prog.Status, owner: v.prog.owner(), epoch: v.prog.Epoch,
			attempts: v.prog.Attempts, hasSpec: v.spec != nil}
		if v.lease != nil {
			in.leaseOwner = v.lease.Owner
			in.leaseOurs = v.lease.Nonce == a.nonce
		}
		if e, ok := a.selfFenced[id]; ok && e == v.prog.Epoch {
			in.selfFenced = true
		}
		_, in.held = a.owned[id]
		out = append(out, in)
	}
	return out
}

func (a *actor) reconcileOwn(now time.Time) error {
	if len(a.owned) < a.cfg.MaxInFlight || a.quarantineScan {
		// Claims only ever go to assigned splits, so the scan covers those;
		// a pending quarantine decision widens it to every split, because a
		// quarantine is executed regardless of assignment (a fleet told to
		// hold nothing must still reach Stalled).
		full := a.quarantineScan
		a.quarantineScan = false
		for _, c := range claimCandidates(a.claimInputs(full), a.self, a.cfg.MaxAttempts) {
			if c.quarantine {
				if err := a.quarantine(c); err != nil {
					return err
				}
				continue
			}
			if a.assigned[c.id] && len(a.owned) < a.cfg.MaxInFlight {
				if err := a.claim(c, now); err != nil {
					return err
				}
			}
		}
	}
	// Cancel revocations the leader withdrew.
	for id, r := range a.revocations {
		if _, held := a.owned[id]; !r.cancelled && held && a.assigned[id] {
			r.cancelled = true
			r.lastProgress = now
			a.m.revocations.WithLabelValues("cancelled").Inc()
			a.log.Debug("revocation cancelled: the leader named the split here again", "split", id)
		}
	}
	// No instruction is not an instruction to hold nothing.
	if !a.assignSeen {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(a.owned)) {
		if a.assigned[id] {
			continue
		}
		if r, ok := a.revocations[id]; ok && !r.cancelled {
			continue
		}
		a.beginRevocation(id, now)
	}
	return nil
}

// claim takes a split with the two-key claim: the lease key first, then the
// progress-record compare-and-swap that bumps the epoch (the real fence).
func (a *actor) claim(c claimCandidate, now time.Time) error {
	id, key := c.id, prefixSplit+c.id
	v := a.splits[id]
	kind := c.kind
	if kind == claimExpired {
		// A cooperative release is two writes on two watch streams; a fast
		// claimant can see the lease vanish before the owner-clear arrives.
		// Read the record: a fresh null owner means the split was released.
		held := v.progRev
		e, ok, err := a.st.Get(a.ctx, Durable, key)
		if err != nil {
			a.m.writes.WithLabelValues("error").Inc()
			return nil
		}
		if ok {
			r, err := decodeProgress(key, id, e.Value, a.fpHash)
			if err != nil {
				return err
			}
			a.upsert(id, r, e.Revision, true)
			if r.owner() == "" && e.Revision >= held {
				kind = claimReleased
			}
		}
		if v.prog.Status != statusRunnable || v.lease != nil && v.lease.Owner != a.self {
			return nil
		}
	}
	next := v.prog.Epoch + 1
	lv := leaseVal{Schema: SchemaVersion, Owner: a.self, Nonce: a.nonce, Epoch: next}
	var o Outcome
	var err error
	if v.lease != nil && v.lease.Owner == a.self {
		// Our predecessor's lease (a reclaim) or our own leftover: take it
		// over in place.
		o, err = a.st.Update(a.ctx, Ephemeral, key, encode(lv), v.leaseRev)
	} else {
		o, err = a.st.Create(a.ctx, Ephemeral, key, encode(lv))
	}
	if err != nil {
		a.m.writes.WithLabelValues("error").Inc()
		a.log.Debug("lease claim failed", "split", id, "err", err)
		return nil
	}
	if !o.Won {
		return nil // a peer won; the watch will show it
	}
	leaseRev := o.Revision
	for try := 0; try < 2; try++ {
		if v.prog == nil || v.spec == nil {
			break
		}
		rec := v.prog.clone()
		rec.Epoch = next
		rec.Owner = strPtr(a.self)
		// Decision: a takeover that consumes an attempt counts it even on the
		// retry after adopting a zombie's late commit; otherwise a poison
		// split with a chatty zombie could dodge its cap.
		if kind.consumesAttempt() {
			rec.Attempts++
		}
		rec.WrittenAtMs = nowMs()
		start := time.Now()
		o, err := a.st.Update(a.ctx, Durable, key, encode(rec), v.progRev)
		a.m.writeDur.Observe(time.Since(start).Seconds())
		if err != nil {
			a.m.writes.WithLabelValues("error").Inc()
			a.log.Debug("claim write failed", "split", id, "err", err)
			break
		}
		if o.Won {
			a.m.writes.WithLabelValues("ok").Inc()
			a.m.acquisitions.WithLabelValues(kind.acquisitionReason()).Inc()
			a.owned[id] = &tenancy{epoch: next, leaseRev: leaseRev, lastOK: now}
			if _, sf := a.selfFenced[id]; sf {
				delete(a.selfFenced, id)
				a.forgiven[id] = true
			}
			a.upsert(id, rec, o.Revision, true)
			if leaseRev > v.leaseRev {
				v.lease, v.leaseRev = &lv, leaseRev
			}
			if at, ok := a.awaiting[id]; ok {
				a.m.assignLatency.Observe(time.Since(at).Seconds())
				delete(a.awaiting, id)
			}
			a.log.Debug("split claimed", "split", id, "epoch", next, "kind", kind.String())
			a.c.emit(Gained{Split: SplitSpec{ID: SplitID{id: id}, Descriptor: v.spec.Descriptor, Weight: v.spec.Weight},
				Epoch: LeaseEpoch(next), Progress: rec.progress()})
			return nil
		}
		a.m.writes.WithLabelValues("conflict").Inc()
		e, ok, err := a.st.Get(a.ctx, Durable, key)
		if err != nil || !ok {
			break
		}
		r, err := decodeProgress(key, id, e.Value, a.fpHash)
		if err != nil {
			return err
		}
		a.upsert(id, r, e.Revision, true)
		if r.Status != statusRunnable || r.Epoch >= next {
			break // another claimant won between our lease write and the CAS
		}
		// A zombie's late commit moved the revision (legal: it was still the
		// owner). Retry on top of it.
	}
	a.deleteLease(id, leaseRev)
	return nil
}

// quarantine parks a split whose next takeover would reach the attempt cap.
// It writes only the progress record, bumping the epoch to fence any zombie.
func (a *actor) quarantine(c claimCandidate) error {
	v := a.splits[c.id]
	key := prefixSplit + c.id
	rec := v.prog.clone()
	rec.Epoch++
	rec.Status = statusQuarant
	rec.Owner = nil
	rec.Attempts++
	rec.WrittenAtMs = nowMs()
	o, err := a.st.Update(a.ctx, Durable, key, encode(rec), v.progRev)
	if err != nil {
		a.m.writes.WithLabelValues("error").Inc()
		a.quarantineScan = true // retry, or a worker at its budget never revisits it
		return nil
	}
	if !o.Won {
		a.m.writes.WithLabelValues("conflict").Inc()
		return nil
	}
	a.m.writes.WithLabelValues("ok").Inc()
	a.m.quarantines.Inc()
	a.upsert(c.id, rec, o.Revision, true)
	if c.kind == claimReclaim && v.lease != nil {
		a.deleteLease(c.id, v.leaseRev)
	}
	return nil
}

// ----- revocation ---------------------------------------------------------

func (a *actor) beginRevocation(id string, now time.Time) {
	if r, ok := a.revocations[id]; ok {
		r.cancelled = false // keeps its original anchor: past-deadline forces at once
	} else {
		a.revocations[id] = &revocation{started: now, lastProgress: now}
	}
	a.m.revocations.WithLabelValues("requested").Inc()
	a.log.Debug("drain started", "split", id)
	a.c.emit(RevokeRequested{Split: SplitID{id: id}})
}

func (a *actor) serviceRevocations(now time.Time) {
	for _, id := range slices.Sorted(maps.Keys(a.revocations)) {
		r := a.revocations[id]
		if _, held := a.owned[id]; !held {
			a.settle(id, "forced")
			continue
		}
		switch {
		case !r.cancelled && now.Sub(r.started) >= a.cfg.DrainDeadline:
			a.log.Warn("revocation forced: the drain did not finish within the deadline; its uncommitted tail replays", "split", id, "deadline", a.cfg.DrainDeadline)
			a.force(id)
		case r.cancelled && now.Sub(r.lastProgress) >= a.cfg.DrainDeadline:
			a.log.Warn("a withdrawn revocation's drain stopped committing; releasing the split", "split", id, "silence", a.cfg.DrainDeadline)
			a.force(id)
		}
	}
}

// force releases a revoked split now (owner cleared: the next claim is
// attempt-free; being revoked is not poison evidence).
func (a *actor) force(id string) {
	a.settle(id, "forced")
	if a.releaseOne(id) != releaseFenced {
		a.m.losses.WithLabelValues("revoked").Inc()
		a.c.emit(Lost{Split: SplitID{id: id}})
	}
}

type releaseResult uint8

const (
	releaseNotHeld releaseResult = iota
	releaseWon
	releaseFenced
	releaseFailed
)

// releaseOne hands one held split back: owner cleared, epoch unchanged,
// lease deleted so peers claim at once.
func (a *actor) releaseOne(id string) releaseResult {
	t, held := a.owned[id]
	if !held {
		return releaseNotHeld
	}
	v := a.splits[id]
	key := prefixSplit + id
	rec := v.prog.clone()
	rec.Owner = nil
	rec.WrittenAtMs = nowMs()
	o, err := a.st.Update(a.ctx, Durable, key, encode(rec), v.progRev)
	switch {
	case err != nil:
		// Surrender it anyway: the owner stays set, so the next claim is
		// the conservative kind, but the split is not pinned here.
		a.m.writes.WithLabelValues("error").Inc()
		delete(a.owned, id)
		a.deleteLease(id, t.leaseRev)
		a.settle(id, "forced")
		a.log.Warn("release write failed; surrendering the split anyway", "split", id, "err", err)
		return releaseFailed
	case !o.Won:
		a.m.writes.WithLabelValues("conflict").Inc()
		a.dropLost(id, "fenced", "its record moved before the release")
		return releaseFenced
	}
	a.m.writes.WithLabelValues("ok").Inc()
	delete(a.owned, id)
	a.upsert(id, rec, o.Revision, true)
	a.deleteLease(id, t.leaseRev)
	a.settle(id, "drained")
	return releaseWon
}

// part stops this worker taking part after it released its last split on
// shutdown: no claims, no elections, leadership and presence given up.
func (a *actor) part() {
	if a.parting {
		return
	}
	a.parting = true
	a.demote("parting")
	clear(a.awaiting)
	if a.presenceRev != 0 {
		_, _ = a.st.Delete(a.ctx, Ephemeral, prefixWorker+a.self, a.presenceRev)
	}
	a.log.Info("leaving the fleet", "still_held", len(a.owned))
}

// ----- terminal detection -----------------------------------------------------

// detectTerminal latches AllComplete or Stalled, judged against a listing of
// split records (never the watch-fed view or the planned count alone: a
// subset that happens to be complete must never report success).
func (a *actor) detectTerminal() error {
	if a.terminal || a.plan == nil || a.plan.Finality != finalityFinal {
		return nil
	}
	if uint64(a.nSplits) < a.plan.Planned || a.nCompleted+a.nQuarant != a.nSplits {
		return nil
	}
	if a.terminalAt != 0 && a.terminalAt == a.durableSeq {
		return nil // nothing changed since the last authoritative check
	}
	a.terminalAt = a.durableSeq
	entries, err := a.st.List(a.ctx, Durable, prefixSplit)
	if err != nil {
		a.log.Debug("terminal check deferred: listing failed", "err", err)
		a.terminalAt = 0
		return nil
	}
	for _, e := range entries {
		id := e.Key[len(prefixSplit):]
		r, err := decodeProgress(e.Key, id, e.Value, a.fpHash)
		if err != nil {
			return err
		}
		a.upsert(id, r, e.Revision, true)
	}
	a.terminalAt = a.durableSeq
	if a.nSplits != len(entries) || uint64(a.nSplits) < a.plan.Planned {
		return nil
	}
	switch {
	case a.nCompleted == a.nSplits && a.nQuarant == 0:
		a.terminal = true
		a.log.Info("job complete: every split is completed", "splits", a.nSplits)
		a.c.emit(AllComplete{})
	case a.nCompleted+a.nQuarant == a.nSplits && a.nQuarant > 0:
		a.terminal = true
		a.log.Warn("job stalled: the remaining splits are quarantined", "completed", a.nCompleted, "quarantined", a.nQuarant)
		a.c.emit(Stalled{Completed: uint64(a.nCompleted), Quarantined: uint64(a.nQuarant)})
	}
	return nil
}
