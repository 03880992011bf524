package spate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// claimKind says how a claimable split came to be free, which decides
// whether taking it consumes a delivery attempt.
type claimKind uint8

const (
	// claimCreate: never owned (no lease, no owner, epoch 0). Free.
	claimCreate claimKind = iota + 1
	// claimReleased: handed back gracefully (no lease, owner cleared). Free.
	claimReleased
	// claimReclaim: a live lease under our own instance id from a restarted
	// predecessor. Consumes an attempt.
	claimReclaim
	// claimExpired: the owner died (no lease, owner still set). Consumes an
	// attempt.
	claimExpired
)

func (k claimKind) String() string {
	return [...]string{"?", "create", "released", "reclaim", "expired"}[k]
}

func (k claimKind) consumesAttempt() bool { return k == claimReclaim || k == claimExpired }

// charged is the attempt rule: a takeover is charged an attempt only if
// the tenancy it ends ended non-gracefully (an expired owner, a restarted
// predecessor) and made no durable progress. An explicit Fail always
// counts (failSplit); graceful endings (release, drain, completion) and
// this process's own self-fences (the store, not the split, was
// unreachable) never do.
func charged(k claimKind, advanced bool) bool { return k.consumesAttempt() && !advanced }

// acquisitionReason is the metric label of a claim that won.
func (k claimKind) acquisitionReason() string {
	return [...]string{"?", "create", "reassigned", "reclaimed", "expired"}[k]
}

// claimCandidate is one split this worker could take, or must quarantine.
type claimCandidate struct {
	id         string
	kind       claimKind
	quarantine bool // the takeover would reach the attempt cap
}

// claimInput is one split of the view, as the claim scan sees it.
type claimInput struct {
	id         string
	status     string
	owner      string // durable owner, "" if none
	epoch      uint64
	attempts   uint32
	leaseOwner string // live lease owner, "" if no lease
	leaseOurs  bool   // the live lease is this process's own leftover
	selfFenced bool   // this process stopped the tenancy itself (store unreachable)
	leaseFresh bool   // the lease's delete arrived moments ago (releaseSettle)
	advanced   bool   // the current tenancy moved the watermark forward
	hasSpec    bool
	held       bool // this worker holds it
}

// claimCandidates is the pure claim scan. A split is a candidate when it is
// runnable, not held here, and has no live lease owned by another instance.
// A lease left by this very process (a hand-back whose delete has not
// landed yet) counts as no lease: the record's owner decides the kind.
// A takeover that is charged an attempt (see charged) and would reach
// maxAttempts becomes a quarantine (allowed without the spec: it writes
// only the progress record);
// a claim needs the spec (there is nothing to hand the source without it).
// Candidates are ordered by kind (the contended kinds last), then id; weight
// plays no part (placement comes from the leader).
func claimCandidates(splits []claimInput, self string, maxAttempts int) []claimCandidate {
	var out []claimCandidate
	for _, s := range splits {
		if s.status != statusRunnable || s.held {
			continue
		}
		var kind claimKind
		switch {
		case s.leaseOwner != "" && s.leaseOwner != self:
			continue
		case s.leaseOwner == self && !s.leaseOurs:
			kind = claimReclaim // a restarted predecessor's lease
		case s.owner == self && s.selfFenced:
			// This very process stopped the tenancy because it could not
			// reach the store: no evidence against the split.
			kind = claimReleased
		case s.owner != "" && s.leaseFresh:
			// The lease went moments ago and the record still names its
			// owner: most likely a release whose owner-clear is still on
			// the other watch stream. Wait for it rather than take the
			// expired path, which loses its compare-and-swap and reads.
			continue
		case s.owner != "":
			kind = claimExpired
		case s.epoch == 0:
			kind = claimCreate
		default:
			kind = claimReleased
		}
		if charged(kind, s.advanced) && int(s.attempts)+1 >= maxAttempts {
			out = append(out, claimCandidate{id: s.id, kind: kind, quarantine: true})
			continue
		}
		if !s.hasSpec {
			continue
		}
		out = append(out, claimCandidate{id: s.id, kind: kind})
	}
	slices.SortFunc(out, func(a, b claimCandidate) int {
		if c := cmp.Compare(a.kind, b.kind); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out
}

func (a *actor) claimInputs() []claimInput {
	out := make([]claimInput, 0, len(a.worker.assigned))
	now := time.Now()
	for id := range a.worker.assigned {
		if _, held := a.worker.owned[id]; held {
			// Never a candidate (claimCandidates skips held splits), so
			// its records are not touched: a worker holding its whole
			// assignment scans map keys, not a record per split (the
			// record reads were 5% of CPU at 50 workers on etcd).
			continue
		}
		v := a.job.splits[id]
		if v == nil || v.prog == nil || a.io.busy[id] || a.worker.handingBack[id] > 0 {
			continue
		}
		in := claimInput{id: id, status: v.prog.Status, owner: v.prog.owner(), epoch: v.prog.Epoch,
			attempts: v.prog.Attempts, hasSpec: v.spec != nil, advanced: v.prog.advanced()}
		if v.lease != nil {
			in.leaseOwner = v.lease.Owner
			in.leaseOurs = v.lease.Nonce == a.nonce
		} else if until := v.leaseGoneAt.Add(a.c.tm.releaseSettle); now.Before(until) {
			in.leaseFresh = true
			a.wake.arm(until)
		}
		if e, ok := a.worker.selfFenced[id]; ok && e == v.prog.Epoch {
			in.selfFenced = true
		}
		out = append(out, in)
	}
	return out
}

// reconcileOwn moves this worker toward its assignment: it claims assigned
// splits while it has lanes to spare, quarantines splits out of attempts,
// and starts revoking held splits it is no longer assigned.
func (a *actor) reconcileOwn(now time.Time) error {
	a.worker.withdrawRevocations(now)
	if !a.worker.ownDirty && !a.worker.quarantineScan {
		// Nothing this worker holds or is assigned changed since the last
		// scan (touch, and the loop's non-watch inputs): an event about
		// someone else's split costs no O(own) work.
		return nil
	}
	a.worker.ownDirty = false
	taken := a.lanesTaken()
	if taken+a.worker.claiming < a.cfg.MaxInFlight || a.worker.quarantineScan {
		// Decision: only a worker entitled to claim a split — the leader
		// assigned it here — may quarantine it, and on the same evidence a
		// takeover needs (quarantineIO re-reads the record). A peer that
		// merely sees a lease vanish must not park a split whose owner is
		// alive or whose progress record's update has not reached it yet.
		// The scan covers the assigned splits; a pending quarantine
		// decision runs it even with every lane busy.
		a.worker.quarantineScanned()
		for _, c := range claimCandidates(a.claimInputs(), a.self, a.cfg.MaxAttempts) {
			if !a.w.viewLoaded(c.id) {
				continue // its snapshot brings ownDirty
			}
			if !a.io.due(opKey{"claim", c.id}, now) {
				if c.quarantine {
					a.worker.scanForQuarantine() // keep the decision pending
				}
				continue
			}
			if c.quarantine {
				a.quarantine(c)
				continue
			}
			if a.worker.assigned[c.id] && taken+a.worker.claiming < a.cfg.MaxInFlight && a.worker.undrained == 0 {
				a.claim(c)
			}
		}
	}
	// No instruction is not an instruction to hold nothing.
	if !a.worker.assignSeen {
		return nil
	}
	var revoke []string
	for id := range a.worker.owned {
		if a.worker.assigned[id] {
			continue
		}
		if a.worker.revocations.pending(id) {
			continue
		}
		revoke = append(revoke, id)
	}
	slices.Sort(revoke)
	for _, id := range revoke {
		if a.worker.revocations.begin(id, a.worker.owned[id], now) {
			a.c.emit(RevokeRequested{Split: SplitID{id: id}})
		}
	}
	return nil
}

// lanesTaken is how many of this worker's lanes its held splits take: a
// parked split (its last commit said its input is idle) takes none.
func (a *actor) lanesTaken() int {
	n := len(a.worker.owned)
	for id := range a.worker.owned {
		if v := a.job.splits[id]; v != nil && v.prog != nil && v.prog.Parked {
			n--
		}
	}
	return n
}

// claimIn is a claim's snapshot of the view, taken on the loop.
type claimIn struct {
	id        string
	kind      claimKind
	prog      *progressRecord
	progRev   uint64
	takeLease bool // our own instance's lease: take it over in place
	leaseRev  uint64
}

// claimOut is what a claim learned beside the loop.
type claimOut struct {
	kind     claimKind
	reads    []readRecord // progress records read on the way
	won      bool
	rec      *progressRecord
	rev      uint64
	lease    leaseVal
	leaseRev uint64
	sent     time.Time    // when the lease write was sent
	sess     *sessionHold // the session the lease is bound to; nil: none
	err      error        // Fatal
}

// readRecord is a progress record read from the store.
type readRecord struct {
	rec *progressRecord
	rev uint64
}

// claim takes a split with the two-key claim, beside the loop: the lease
// key first, then the progress-record compare-and-swap that bumps the
// epoch (the real fence).
func (a *actor) claim(c claimCandidate) {
	v := a.job.splits[c.id]
	in := claimIn{id: c.id, kind: c.kind, prog: v.prog.clone(), progRev: v.progRev}
	if v.lease != nil && v.lease.Owner == a.self {
		in.takeLease, in.leaseRev = true, v.leaseRev
	}
	a.worker.claimStarted()
	since := a.job.mark()
	a.splitIO(c.id, func(ctx context.Context) func() error {
		out := a.claimIO(ctx, in)
		return func() error {
			a.worker.claimEnded()
			return a.claimDone(in, out, since)
		}
	})
}

// claimIO runs the two writes of a claim beside the loop: the lease key,
// then the fence on the progress record.
func (e *env) claimIO(ctx context.Context, in claimIn) (out claimOut) {
	out.kind = in.kind
	if e.writeLease(ctx, in, &out) {
		e.writeClaim(ctx, in, &out)
	}
	return out
}

// writeLease writes the split's lease key at the next epoch and reports
// whether it won.
func (e *env) writeLease(ctx context.Context, in claimIn, out *claimOut) bool {
	key := prefixSplit + in.id
	// A takeover fences on the record the view holds, without reading it
	// first: if anything moved it (a release whose owner-clear the view has
	// not seen yet, a zombie's late commit), the compare-and-swap loses and
	// the re-read in writeClaim decides.
	out.lease = leaseVal{Schema: SchemaVersion, Owner: e.self, Nonce: e.nonce, Epoch: in.prog.Epoch + 1}
	out.sent = time.Now()
	var o Outcome
	var err error
	// On a store with sessions the lease is bound to this worker's
	// session, which the renewer keeps alive for every lease at once.
	out.sess = e.renew.session()
	switch {
	case in.takeLease && out.sess != nil:
		// Our predecessor's lease (a reclaim) or our own leftover: take it
		// over in place.
		o, err = out.sess.s.Update(ctx, key, encode(out.lease), in.leaseRev)
	case in.takeLease:
		o, err = e.st.Update(ctx, Ephemeral, key, encode(out.lease), in.leaseRev)
	case out.sess != nil:
		o, err = out.sess.s.Create(ctx, key, encode(out.lease))
	default:
		o, err = e.st.Create(ctx, Ephemeral, key, encode(out.lease))
	}
	if err != nil {
		e.m.writes.WithLabelValues("error").Inc()
		e.log.Debug("lease claim failed", "split", in.id, "err", err)
		return false
	}
	if !o.Won {
		return false // a peer won; the watch will show it
	}
	out.leaseRev = o.Revision
	return true
}

// writeClaim fences the progress record at the lease's epoch: the real
// claim. When it cannot, it deletes the lease it wrote.
func (e *env) writeClaim(ctx context.Context, in claimIn, out *claimOut) {
	key := prefixSplit + in.id
	next := out.lease.Epoch
	base, baseRev := in.prog, in.progRev
	read := func() (*progressRecord, uint64, bool) {
		got, ok, err := e.st.Get(ctx, Durable, key)
		if err != nil || !ok {
			return nil, 0, false
		}
		r, err := decodeProgress(key, in.id, got.Value, e.fpHash)
		if err != nil {
			out.err = err
			return nil, 0, false
		}
		out.reads = append(out.reads, readRecord{r, got.Revision})
		return r, got.Revision, true
	}
	for range 2 {
		rec := base.clone()
		rec.Epoch = next
		rec.Owner = strPtr(e.self)
		rec.Parked = false // a new tenancy takes a lane until its source parks it again
		// Decision: a takeover that consumes an attempt counts it even on the
		// retry after adopting a zombie's late commit; otherwise a poison
		// split with a chatty zombie could dodge its cap.
		if charged(out.kind, base.advanced()) {
			rec.Attempts++
			rec.LastFailure = deathText(base.owner(), base.Epoch)
		}
		rec.WrittenAtMs = nowMs()
		start := time.Now()
		o, err := e.st.Update(ctx, Durable, key, encode(rec), baseRev)
		e.m.writeDur.Observe(time.Since(start).Seconds())
		if err != nil {
			e.m.writes.WithLabelValues("error").Inc()
			e.log.Debug("claim write failed", "split", in.id, "err", err)
			// The write may have landed with its reply lost: adopt it if
			// the record now carries this claim, rather than re-claim our
			// own tenancy later as an expired one (an attempt for nothing).
			if r, rev, ok := read(); ok && r.owner() == e.self && r.Epoch == next && r.Status == statusRunnable {
				out.won, out.rec, out.rev = true, r, rev
				return
			}
			break
		}
		if o.Won {
			e.m.writesOK.Inc()
			out.won, out.rec, out.rev = true, rec, o.Revision
			return
		}
		e.m.writes.WithLabelValues("conflict").Inc()
		r, rev, ok := read()
		if !ok || r.Status != statusRunnable || r.Epoch >= next {
			break // another claimant won between our lease write and the CAS
		}
		if out.kind == claimExpired && r.owner() == "" {
			// A cooperative release is two writes on two watch streams; a
			// fast claimant can see the lease vanish before the owner-clear
			// arrives. The split was released, not abandoned.
			out.kind = claimReleased
		}
		// A zombie's late commit or the owner-clear of a release moved the
		// revision (legal: it was still the owner). Retry on top of it.
		base, baseRev = r, rev
	}
	deleteOwnLease(ctx, e.st, in.id, out.leaseRev, e.self, e.nonce, next)
	out.leaseRev = 0
}

func (a *actor) claimDone(in claimIn, out claimOut, since uint64) error {
	for _, r := range out.reads {
		a.upsert(in.id, r.rec, r.rev, readSince(since))
	}
	if out.err != nil {
		if isDamage(out.err) {
			a.damage(in.id, prefixSplit+in.id, 0, out.err)
			a.failed(opKey{"claim", in.id})
			return nil
		}
		return out.err
	}
	if !out.won {
		// Lost or failed: either way the view was not what the store holds
		// (a watch event will correct it) or the store is failing; do not
		// try again at once.
		a.failed(opKey{"claim", in.id})
		return nil
	}
	id := in.id
	v := a.job.splits[id]
	next := out.rec.Epoch
	a.m.acquisitions.WithLabelValues(out.kind.acquisitionReason()).Inc()
	t := &tenancy{epoch: next}
	a.worker.gain(id, t)
	a.w.scopeDirty = true
	a.renew.hold(id, next, out.leaseRev, out.sent, out.sess)
	a.upsert(id, out.rec, out.rev, live)
	a.io.openCell(id, t, a.job.splits[id])
	if out.leaseRev > v.leaseRev {
		lv := out.lease
		v.lease, v.leaseRev, v.leaseAt = &lv, out.leaseRev, a.job.clock
	}
	if v.progRev > out.rev && (v.prog.Epoch != next || v.prog.owner() != a.self) {
		// The view already holds a later write: a peer fenced this claim
		// before its answer was folded.
		a.dropLost(id, "fenced", fmt.Sprintf("a claimant fenced it at epoch %d", v.prog.Epoch))
		return nil
	}
	if at, ok := a.worker.arrived(id); ok {
		a.m.assignLatency.Observe(time.Since(at).Seconds())
	}
	a.log.Debug("split claimed", "split", id, "epoch", next, "kind", out.kind.String())
	desc, weight := v.own()
	a.c.emit(Gained{Split: SplitSpec{ID: SplitID{id: id}, Descriptor: desc, Weight: weight},
		Epoch: LeaseEpoch(next), Progress: out.rec.progress()})
	if a.worker.parting {
		return a.releaseSplit(id, func(releaseResult) {})
	}
	return nil
}

// quarantine parks a split whose next takeover would reach the attempt
// cap, beside the loop. It first re-reads the record, as a takeover does:
// a split released in the meantime (owner cleared), or whose tenancy
// advanced, is no longer a quarantine. It writes only the progress record,
// bumping the epoch to fence any zombie.
func (a *actor) quarantine(c claimCandidate) {
	v := a.job.splits[c.id]
	viewRev := v.progRev
	since := a.job.mark()
	key := prefixSplit + c.id
	a.splitIO(c.id, func(ctx context.Context) func() error {
		e, ok, err := a.st.Get(ctx, Durable, key)
		var cur *progressRecord
		if err == nil && ok {
			cur, err = decodeProgress(key, c.id, e.Value, a.fpHash)
		}
		if err != nil || !ok {
			return func() error {
				if kindOf(err) == kindFatal {
					return err
				}
				a.failed(opKey{"claim", c.id})
				return nil
			}
		}
		kind := c.kind
		if kind == claimExpired && cur.owner() == "" && e.Revision >= viewRev {
			kind = claimReleased
		}
		if cur.Status != statusRunnable || !charged(kind, cur.advanced()) || int(cur.Attempts)+1 < a.cfg.MaxAttempts {
			return func() error {
				a.upsert(c.id, cur, e.Revision, readSince(since))
				return nil
			}
		}
		rec := cur.clone()
		rec.Epoch++
		rec.Status = statusQuarant
		rec.Owner = nil
		rec.Attempts++
		rec.LastFailure = deathText(cur.owner(), cur.Epoch)
		rec.WrittenAtMs = nowMs()
		o, err := a.st.Update(ctx, Durable, key, encode(rec), e.Revision)
		return func() error {
			a.upsert(c.id, cur, e.Revision, readSince(since))
			switch {
			case err != nil:
				a.m.writes.WithLabelValues("error").Inc()
				a.failed(opKey{"claim", c.id})
				a.worker.scanForQuarantine() // retry, or a worker at its budget never revisits it
			case !o.Won:
				a.m.writes.WithLabelValues("conflict").Inc()
				a.failed(opKey{"claim", c.id})
			default:
				a.m.writesOK.Inc()
				a.m.quarantines.Inc()
				a.upsert(c.id, rec, o.Revision, live)
				if c.kind == claimReclaim && v.lease != nil {
					a.deleteKey(Ephemeral, prefixSplit+c.id, v.leaseRev)
				}
			}
			return nil
		}
	})
}

// adoptAssignment replaces this worker's instruction, unless a deposed
// leader's late write would walk it backwards.
func (a *actor) adoptAssignment(val *assignmentVal, now time.Time) {
	if !a.worker.adopt(val, now) {
		a.log.Debug("ignoring an assignment from an older generation", "generation", val.Generation, "seen", a.worker.assignGen)
		return
	}
	a.w.scopeDirty = true
}

func (a *actor) forgetAssignment() {
	a.worker.forget()
	a.w.scopeDirty = true
}
