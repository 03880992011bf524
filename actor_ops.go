package spate

import (
	"context"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ----- heartbeat --------------------------------------------------------------

// renewGate skips a lease renewal written less than this long ago, so a
// split claimed just before a beat is not rewritten at once. With beats every
// 0.8–1.2 × lease/3, a lease is rewritten at least every ~0.63 lease.
func (a *actor) renewGate() time.Duration { return a.cfg.LeaseDuration / 3 * 7 / 10 }

func (a *actor) heartbeat() error {
	now := time.Now()
	// Presence first: membership must outlive lease hiccups. A parted worker
	// stays gone.
	if !a.parting {
		if err := a.renewPresence(); err != nil {
			return err
		}
	}
	if a.leading != nil {
		val := leaderVal{Schema: SchemaVersion, Owner: a.self, Nonce: a.nonce, Generation: a.leading.generation}
		o, err := a.st.Update(a.ctx, Ephemeral, keyLeader, encode(val), a.leading.rev)
		switch {
		case err != nil:
			a.log.Debug("leader renewal failed; retrying next beat", "err", err)
		case !o.Won:
			a.demote("renewal fenced")
		default:
			a.leading.rev = o.Revision
			a.leaderObs, a.leaderRev = &val, max(a.leaderRev, o.Revision)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.owned)) {
		t := a.owned[id]
		if t == nil || now.Sub(t.lastOK) < a.renewGate() {
			continue
		}
		if err := a.renew(id, t, now); err != nil {
			return err
		}
	}
	// Starvation self-fence: a split not renewed for a whole lease may
	// already be another's; stop it rather than run unfenced.
	for _, id := range slices.Sorted(maps.Keys(a.owned)) {
		if t := a.owned[id]; now.Sub(t.lastOK) >= a.cfg.LeaseDuration {
			a.dropLost(id, "starved", "self-fenced: no lease renewal reached the store for a whole lease")
		}
	}
	return nil
}

func (a *actor) renew(id string, t *tenancy, now time.Time) error {
	key := prefixSplit + id
	lv := leaseVal{Schema: SchemaVersion, Owner: a.self, Nonce: a.nonce, Epoch: t.epoch}
	v := a.view(id)
	// At most two writes: the renewal, and once more after adopting a
	// renewal that landed though its reply was lost.
	for try := 0; try < 2; try++ {
		o, err := a.st.Update(a.ctx, Ephemeral, key, encode(lv), t.leaseRev)
		if err != nil {
			a.log.Debug("lease renewal failed; retrying next beat", "split", id, "err", err)
			return nil
		}
		if o.Won {
			t.leaseRev, t.lastOK = o.Revision, now
			if o.Revision > v.leaseRev {
				v.lease, v.leaseRev = &lv, o.Revision
			}
			return nil
		}
		a.m.writes.WithLabelValues("conflict").Inc()
		e, ok, err := a.st.Get(a.ctx, Ephemeral, key)
		if err != nil {
			return nil // undecided; next beat
		}
		if !ok {
			a.dropLost(id, "starved", "its lease expired before the renewal")
			return nil
		}
		l, err := decodeLease(key, e.Value)
		if err != nil {
			return err
		}
		switch {
		case l.Owner == a.self && l.Nonce == a.nonce:
			// A previous renewal landed but its reply was lost: adopt its
			// revision (dropping would cost a delivery attempt for nothing)
			// and rewrite at once, since its TTL runs from that earlier write.
			t.leaseRev = e.Revision
			if e.Revision > v.leaseRev {
				v.lease, v.leaseRev = l, e.Revision
			}
		case l.Owner == a.self:
			return a.twin(id)
		default:
			a.dropLost(id, "fenced", "its lease is held by "+l.Owner)
			return nil
		}
	}
	return nil
}

// renewPresence rewrites this worker's presence record. A record that
// another process rewrote after our last write is a live twin: a process
// that shares our instance id announced itself after us (at startup a
// worker adopts whatever record its id has, since that may be its crashed
// predecessor's). The older process is the one that finds out, here, and it
// stops with a Fatal error; the newer keeps running. A record that expired
// or whose rewrite was ours (a lost reply) is simply rewritten.
func (a *actor) renewPresence() error {
	key := prefixWorker + a.self
	if a.presenceRev != 0 {
		o, err := a.st.Update(a.ctx, Ephemeral, key, a.presenceValue(), a.presenceRev)
		if err == nil && o.Won {
			a.presenceRev = o.Revision
			return nil
		}
		if err != nil {
			a.log.Debug("presence renewal failed", "err", err)
			return nil
		}
	}
	e, ok, err := a.st.Get(a.ctx, Ephemeral, key)
	if err != nil {
		return nil
	}
	var o Outcome
	if ok {
		if a.presenceRev != 0 {
			w, derr := decodeWorker(key, e.Value)
			switch {
			case derr != nil:
				a.log.Warn("unreadable presence record under our instance id; rewriting it", "key", key, "err", derr)
			case w.Nonce != a.nonce && e.Revision > a.presenceRev:
				return Fatalf("two live workers share the instance id %q (another process rewrote our presence record %s after our last write); instance ids must be unique among live workers",
					a.self, key)
			}
		}
		o, err = a.st.Update(a.ctx, Ephemeral, key, a.presenceValue(), e.Revision)
	} else {
		o, err = a.st.Create(a.ctx, Ephemeral, key, a.presenceValue())
	}
	if err == nil && o.Won {
		a.presenceRev = o.Revision
	}
	return nil
}

// ----- reconcile ---------------------------------------------------------------

// reconcile lists both keyspaces as the backstop for missed watch events: a
// key the view believes live but that is absent from a listing is deleted.
func (a *actor) reconcile() error {
	start := time.Now()
	defer func() { a.m.reconcileDur.Observe(time.Since(start).Seconds()) }()
	if eph, err := a.st.List(a.ctx, Ephemeral, ""); err != nil {
		a.log.Warn("reconcile: listing the ephemeral keyspace failed", "err", err)
	} else {
		live := make(map[string]bool, len(eph))
		for _, e := range eph {
			live[e.Key] = true
		}
		if err := a.dropUnlisted(live); err != nil {
			return err
		}
		for _, e := range eph {
			if err := a.ephemeralPut(e.Key, e.Value, e.Revision); err != nil {
				return err
			}
		}
	}
	if dur, err := a.st.List(a.ctx, Durable, ""); err != nil {
		a.log.Warn("reconcile: listing the durable keyspace failed", "err", err)
	} else {
		listed := make(map[string]bool, len(dur))
		for _, e := range dur {
			listed[e.Key] = true
		}
		for inst := range a.assigns {
			if !listed[prefixAssign+inst] {
				delete(a.assigns, inst)
				if inst == a.self {
					a.forgetAssignment()
				}
			}
		}
		for _, e := range dur {
			if err := a.durablePut(e.Key, e.Value, e.Revision, true); err != nil {
				return err
			}
		}
	}
	// Delay windows elapse on time, not events; this also retries failed
	// assignment writes.
	a.dirty = true
	return nil
}

// ----- commands ---------------------------------------------------------------

func (a *actor) handle(cmd *command) error {
	var err error
	switch cmd.kind {
	case cmdCommit:
		err = a.commit(cmd.split.id, cmd.epoch, cmd.progress)
	case cmdFail:
		err = a.failSplit(cmd.split.id, cmd.reason)
	case cmdRelease, cmdReleaseDrained:
		a.release(cmd.splits, cmd.kind == cmdReleaseDrained)
	case cmdDecline:
		a.decline(cmd.split.id)
	case cmdDepart:
		a.part()
	}
	cmd.reply <- err
	if f, ok := err.(*fatalCommand); ok {
		return f.err
	}
	return nil
}

// fatalCommand is a command error that also stops the actor.
type fatalCommand struct{ err error }

func (f *fatalCommand) Error() string { return f.err.Error() }
func (f *fatalCommand) Unwrap() error { return f.err }

func notHeld(id string) error {
	return Fencedf("split %s is not held by this worker; nothing was written", id)
}

// commit is the fenced commit: one compare-and-swap on the progress record
// at the revision this worker last observed. No explicit epoch comparison is
// needed: any ownership change moved the revision.
func (a *actor) commit(id string, epoch LeaseEpoch, p SplitProgress) error {
	t, held := a.owned[id]
	if !held {
		return notHeld(id)
	}
	if epoch != 0 && uint64(epoch) != t.epoch {
		return Fencedf("split %s: the tenancy at epoch %d ended (this worker now holds epoch %d); nothing was written", id, epoch, t.epoch)
	}
	v := a.splits[id]
	key := prefixSplit + id
	if w := v.prog.Watermark; w != nil && p.Watermark < *w {
		// Confirm against the store before stopping: a store that went
		// back in time may have shown a watermark that never became durable.
		e, ok, err := a.st.Get(a.ctx, Durable, key)
		if err != nil {
			return fmt.Errorf("commit %s: checking a watermark regression: %w", id, err)
		}
		if ok {
			cur, err := decodeProgress(key, id, e.Value, a.fpHash)
			if err != nil {
				return &fatalCommand{err}
			}
			a.upsert(id, cur, e.Revision, true)
			if _, still := a.owned[id]; !still {
				return notHeld(id)
			}
		}
		if w := v.prog.Watermark; w != nil && p.Watermark < *w {
			return &fatalCommand{Fatalf("commit of split %s would move its committed watermark back from %d to %d: a source bug; stopping",
				id, *w, p.Watermark)}
		}
	}
	// Two tries: the second only after finding that our own earlier commit
	// of this tenancy landed though its reply was lost (the revision moved
	// under us, but nobody else did).
	for try := 0; try < 2; try++ {
		rec := v.prog.clone()
		wm := p.Watermark
		rec.Watermark, rec.State, rec.Completed = &wm, p.State, p.Completed
		if p.Completed {
			rec.Status = statusCompleted
		}
		rec.WrittenAtMs = nowMs()
		start := time.Now()
		o, err := a.st.Update(a.ctx, Durable, key, encode(rec), v.progRev)
		a.m.writeDur.Observe(time.Since(start).Seconds())
		if err != nil {
			a.m.writes.WithLabelValues("error").Inc()
			return fmt.Errorf("commit %s: %w", id, err)
		}
		if o.Won {
			a.m.writes.WithLabelValues("ok").Inc()
			a.committed(id, t, rec, o.Revision)
			return nil
		}
		a.m.writes.WithLabelValues("conflict").Inc()
		e, ok, err := a.st.Get(a.ctx, Durable, key)
		if err != nil {
			return fmt.Errorf("commit %s: compare-and-swap lost and the re-read failed: %w", id, err)
		}
		if !ok {
			break
		}
		cur, err := decodeProgress(key, id, e.Value, a.fpHash)
		if err != nil {
			return &fatalCommand{err}
		}
		if cur.owner() != a.self || cur.Epoch != t.epoch || cur.Status != statusRunnable && !cur.Completed {
			a.upsert(id, cur, e.Revision, true)
			break
		}
		if cur.Watermark != nil && *cur.Watermark == p.Watermark && cur.Completed == p.Completed {
			// Exactly this commit landed earlier, its reply lost.
			a.committed(id, t, cur, e.Revision)
			return nil
		}
		if cur.Completed {
			a.committed(id, t, cur, e.Revision) // an earlier completing commit landed
			return nil
		}
		a.upsert(id, cur, e.Revision, true)
		if cur.Watermark != nil && p.Watermark < *cur.Watermark {
			return &fatalCommand{Fatalf("commit of split %s would move its committed watermark back from %d to %d: a source bug; stopping",
				id, *cur.Watermark, p.Watermark)}
		}
	}
	if _, still := a.owned[id]; still {
		a.dropLost(id, "fenced", "a commit lost its compare-and-swap")
	}
	return Fencedf("split %s: the commit lost its compare-and-swap (another owner took it); nothing was written", id)
}

func (a *actor) committed(id string, t *tenancy, rec *progressRecord, rev uint64) {
	if r, ok := a.revocations[id]; ok {
		r.lastProgress = time.Now()
	}
	a.upsert(id, rec, rev, true)
	if rec.Completed {
		delete(a.owned, id)
		a.settle(id, "drained")
		a.deleteLease(id, t.leaseRev)
	}
}

// failSplit consumes one delivery attempt and hands the split back; at the
// cap it quarantines it instead (epoch bumped to fence any zombie).
func (a *actor) failSplit(id, reason string) error {
	t, held := a.owned[id]
	if !held {
		return notHeld(id)
	}
	a.m.failures.Inc()
	v := a.splits[id]
	rec := v.prog.clone()
	rec.Attempts++
	rec.Owner = nil
	quarantined := int(rec.Attempts) >= a.cfg.MaxAttempts
	if quarantined {
		rec.Status = statusQuarant
		rec.Epoch++
	}
	rec.WrittenAtMs = nowMs()
	o, err := a.st.Update(a.ctx, Durable, prefixSplit+id, encode(rec), v.progRev)
	if err != nil {
		a.m.writes.WithLabelValues("error").Inc()
		return fmt.Errorf("fail %s: %w", id, err)
	}
	if !o.Won {
		a.m.writes.WithLabelValues("conflict").Inc()
		a.dropLost(id, "fenced", "a failure report lost its compare-and-swap")
		return Fencedf("split %s: the failure report lost its compare-and-swap; nothing was written", id)
	}
	a.m.writes.WithLabelValues("ok").Inc()
	// Leave the owned set before folding, so the epoch bump is not read as
	// a foreign fence. No Lost: the source asked for this.
	delete(a.owned, id)
	a.settle(id, "forced")
	if quarantined {
		a.m.quarantines.Inc()
	}
	a.upsert(id, rec, o.Revision, true)
	a.deleteLease(id, t.leaseRev)
	a.log.Warn("split failed by the source", "split", id, "reason", reason, "attempts", rec.Attempts, "quarantined", quarantined)
	return nil
}

func (a *actor) release(splits []SplitID, drained bool) {
	released := 0
	for _, s := range splits {
		if a.releaseOne(s.id) == releaseWon {
			released++
		}
	}
	a.m.releases.Add(float64(released))
	// A departure is judged on what was asked, not on what landed; a
	// drained hand-back is never one.
	if !drained && len(splits) > 0 && len(a.owned) == 0 {
		a.part()
	}
}

func (a *actor) decline(id string) {
	r, ok := a.revocations[id]
	if !ok {
		return
	}
	if r.cancelled {
		delete(a.revocations, id) // nothing to comply with: the split stays
		return
	}
	a.log.Debug("revocation declined by the source; forcing it", "split", id)
	a.force(id)
}

// ----- planning ---------------------------------------------------------------

type planOutcome uint8

const (
	planOK planOutcome = iota + 1
	planNoop
	planError // retry on the next replan tick
	planLost  // a successor bumped the generation: demote
	planFatal
)

type planResult struct {
	outcome planOutcome
	plan    *planRecord
	rev     uint64
	err     error
	created int
}

// planSeedConcurrency bounds the seeding writes in flight.
const planSeedConcurrency = 8

// startPlan launches a due planner run off the actor goroutine. Every write
// the run makes is create-if-absent of deterministic ids, or one
// compare-and-swap on the plan revision captured now, so it cannot race the
// actor's decisions.
func (a *actor) startPlan() {
	if !a.planDue || a.planRunning || a.plan == nil {
		return
	}
	a.planDue = false
	a.planRunning = true
	snap, rev := *a.plan, a.planRev
	ctx, cancel := context.WithCancel(a.ctx)
	a.planCancel = cancel
	go func() {
		defer cancel()
		a.planDone <- a.runPlan(ctx, snap, rev)
	}()
}

func (a *actor) runPlan(ctx context.Context, snap planRecord, rev uint64) (res planResult) {
	start := time.Now()
	defer func() { a.m.replanDur.Observe(time.Since(start).Seconds()) }()
	var cursor []byte
	if snap.PlannerState != nil {
		cursor = *snap.PlannerState
	}
	var plan SplitPlan
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = Fatalf("the planner panicked: %v\n%s", p, debug.Stack())
			}
		}()
		plan, err = a.planner.Plan(ctx, PlanContext{PlannerState: cursor, Generation: snap.Generation})
		return err
	}()
	if err != nil {
		if ctx.Err() != nil || KindOf(err) == KindRetryable {
			return planResult{outcome: planError, err: err}
		}
		return planResult{outcome: planFatal, err: fmt.Errorf("planner: %w", err)}
	}
	for _, s := range plan.Splits {
		if s.Spec.ID.IsZero() {
			return planResult{outcome: planFatal, err: Fatalf("planner returned a split with a zero SplitID")}
		}
	}
	created, err := a.seed(ctx, plan.Splits, snap.Generation)
	if err != nil {
		if KindOf(err) == KindFatal {
			return planResult{outcome: planFatal, err: err}
		}
		return planResult{outcome: planError, err: err, created: created}
	}
	// Recount from a listing, never locally: a crash or a failed publish
	// between seeding and publishing would otherwise desynchronise terminal
	// detection for good.
	entries, err := a.st.List(ctx, Durable, prefixSplit)
	if err != nil {
		return planResult{outcome: planError, err: err, created: created}
	}
	next := snap
	next.Planned = uint64(len(entries))
	// Decision: Final is sticky. A later run that reports Open cannot reopen
	// a final plan (terminal detection may already have fired).
	if plan.Finality == PlanFinal || snap.Finality == finalityFinal {
		next.Finality = finalityFinal
	} else {
		next.Finality = finalityOpen
	}
	if plan.PlannerState != nil {
		st := plan.PlannerState
		next.PlannerState = &st
	}
	next.UpdatedAtMs = nowMs()
	o, err := a.st.Update(ctx, Durable, keyPlan, encode(&next), rev)
	if err != nil {
		return planResult{outcome: planError, err: err, created: created}
	}
	if !o.Won {
		return planResult{outcome: planLost, created: created}
	}
	out := planNoop
	if created > 0 || next.Finality != snap.Finality || next.Planned != snap.Planned {
		out = planOK
	}
	return planResult{outcome: out, plan: &next, rev: o.Revision, created: created}
}

// seed writes each planned split, spec first then progress, both
// create-if-absent: a seed never overwrites an existing record.
func (a *actor) seed(ctx context.Context, splits []PlannedSplit, gen uint64) (int, error) {
	var created atomic.Int64
	var firstErr error
	var mu sync.Mutex
	setErr := func(err error) {
		mu.Lock()
		if firstErr == nil || KindOf(err) == KindFatal && KindOf(firstErr) != KindFatal {
			firstErr = err
		}
		mu.Unlock()
	}
	sem := make(chan struct{}, planSeedConcurrency)
	var wg sync.WaitGroup
	seen := make(map[string]bool, len(splits))
	for _, s := range splits {
		id := s.Spec.ID.id
		if seen[id] {
			continue // first occurrence wins
		}
		seen[id] = true
		spec := encode(&specRecord{Schema: SchemaVersion, ID: id, FP: a.fpHash, Generation: gen,
			Weight: s.Spec.EffectiveWeight(), Descriptor: nonNil(s.Spec.Descriptor)})
		prog := encode(newProgressRecord(id, a.fpHash, s.Seed))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if ctx.Err() != nil {
				return
			}
			if _, err := a.st.Create(ctx, Durable, prefixSpec+id, spec); err != nil {
				setErr(fmt.Errorf("seeding spec %s: %w", id, err))
				return
			}
			o, err := a.st.Create(ctx, Durable, prefixSplit+id, prog)
			if err != nil {
				setErr(fmt.Errorf("seeding split %s: %w", id, err))
				return
			}
			if o.Won {
				created.Add(1)
				a.m.planned.Inc()
			}
		})
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = Retryablef("planning cancelled: %w", ctx.Err())
	}
	return int(created.Load()), firstErr
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (a *actor) finishPlan(res planResult) error {
	a.planRunning = false
	a.planCancel = nil
	switch res.outcome {
	case planFatal:
		a.m.replans.WithLabelValues("error").Inc()
		return res.err
	case planError:
		a.m.replans.WithLabelValues("error").Inc()
		a.log.Warn("planner run failed; the next replan tick retries", "err", res.err, "seeded", res.created)
	case planLost:
		a.m.replans.WithLabelValues("error").Inc()
		a.demote("a successor bumped the generation while we planned")
	case planOK, planNoop:
		if res.outcome == planOK {
			a.m.replans.WithLabelValues("ok").Inc()
		} else {
			a.m.replans.WithLabelValues("noop").Inc()
		}
		wasFinal := a.plan != nil && a.plan.Finality == finalityFinal
		if res.rev > a.planRev {
			a.plan, a.planRev = res.plan, res.rev
			a.durableSeq++
		}
		if !wasFinal && res.plan.Finality == finalityFinal {
			a.log.Info("plan is final", "planned", res.plan.Planned)
		}
		a.dirty = true
	}
	return nil
}
