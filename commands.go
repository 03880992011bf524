package spate

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// The commands the source sends through the handle: commit, fail, release,
// decline, depart. Each is taken by the loop at once; the store write runs
// beside it (one in flight per split, in order), and the reply goes back
// when the write's answer has been folded into the view.

func (a *actor) handle(cmd *command) error {
	switch cmd.kind {
	case cmdCommit:
		return a.onSplit(cmd.split.id, func() error { return a.startCommit(cmd, false, 0) })
	case cmdFail:
		return a.onSplit(cmd.split.id, func() error { return a.failSplit(cmd) })
	case cmdRelease, cmdReleaseDrained:
		return a.release(cmd)
	case cmdDecline:
		err := a.decline(cmd.split.id)
		cmd.reply <- nil
		return err
	case cmdDepart:
		a.part()
		cmd.reply <- nil
	}
	return nil
}

func notHeld(id string) error {
	return Fencedf("split %s is not held by this worker; nothing was written", id)
}

// ----- commit -------------------------------------------------------------------

// commitOut is what a commit learned beside the loop.
type commitOut struct {
	won  bool
	rec  *progressRecord // the record written
	rev  uint64
	read bool            // the record was re-read (after a lost CAS, or for a regression check)
	cur  *progressRecord // what the re-read found; nil if the record is gone
	err  error
}

// startCommit is the fenced commit: one compare-and-swap on the progress
// record at the revision this worker last observed. No explicit epoch
// comparison is needed: any ownership change moved the revision. With
// confirmed unset and a watermark below the view's, it first re-reads the
// record: a store that went back in time may have shown a watermark that
// never became durable.
func (a *actor) startCommit(cmd *command, confirmed bool, try int) error {
	id, p := cmd.split.id, cmd.progress
	t, held := a.owned[id]
	if !held {
		cmd.reply <- notHeld(id)
		return nil
	}
	if cmd.epoch != 0 && uint64(cmd.epoch) != t.epoch {
		cmd.reply <- Fencedf("split %s: the tenancy at epoch %d ended (this worker now holds epoch %d); nothing was written", id, cmd.epoch, t.epoch)
		return nil
	}
	v := a.splits[id]
	check := !confirmed && checkMonotone(id, v.prog.Watermark, p.Watermark) != nil
	rec := nextProgress(v.prog, t, p)
	baseRev := v.progRev
	since := a.mark()
	a.splitIO(id, func(ctx context.Context) func() error {
		out := a.commitIO(ctx, v, id, rec, baseRev, check)
		return func() error {
			v.pending.Store(nil)
			return a.commitDone(cmd, t, out, since, check, try)
		}
	})
	return nil
}

// nextProgress is the record a commit of p writes over prev.
func nextProgress(prev *progressRecord, t *tenancy, p SplitProgress) *progressRecord {
	rec := prev.clone()
	if advances(prev.Watermark, p.Watermark) {
		rec.AdvancedEpoch = t.epoch
	}
	wm := p.Watermark
	rec.Watermark, rec.State, rec.Completed, rec.Output = &wm, p.State, p.Completed, p.Output
	if p.Completed {
		rec.Status = statusCompleted
	}
	return rec
}

func (a *actor) commitIO(ctx context.Context, v *splitView, id string, rec *progressRecord, baseRev uint64, check bool) (out commitOut) {
	key := prefixSplit + id
	reread := func() {
		out.read = true
		e, ok, err := a.st.Get(ctx, Durable, key)
		switch {
		case err != nil:
			out.err = err
		case ok:
			out.rev = e.Revision
			out.cur, out.err = decodeProgress(key, id, e.Value, a.fpHash)
		}
	}
	if check {
		reread()
		return out
	}
	rec.WrittenAtMs = nowMs()
	value := encode(rec)
	v.pending.Store(&pendingWrite{value: value, rec: rec})
	start := time.Now()
	o, err := a.st.Update(ctx, Durable, key, value, baseRev)
	a.m.writeDur.Observe(time.Since(start).Seconds())
	if err != nil {
		a.m.writes.WithLabelValues("error").Inc()
		out.err = err
		return out
	}
	if o.Won {
		a.m.writesOK.Inc()
		out.won, out.rec, out.rev = true, rec, o.Revision
		return out
	}
	a.m.writes.WithLabelValues("conflict").Inc()
	reread()
	return out
}

// commitVerdict is what a commit's compare-and-swap loss means.
type commitVerdict uint8

const (
	// verdictFenced: another owner took the split (or its record is gone).
	verdictFenced commitVerdict = iota + 1
	// verdictLanded: exactly this commit, or an earlier completing one of
	// this tenancy, landed before (its reply was lost): adopt it.
	verdictLanded
	// verdictRetry: an earlier commit of this tenancy landed though its
	// reply was lost, so the revision moved under us but nobody else did:
	// commit again on top of it.
	verdictRetry
	// verdictRegress: the commit would move the committed watermark back:
	// a source bug, Fatal.
	verdictRegress
)

// lostCommitVerdict judges a lost commit compare-and-swap from the record
// the store holds now (nil if it is gone): the tenancy is this worker's at
// epoch, and p is the progress it tried to commit.
func lostCommitVerdict(cur *progressRecord, self string, epoch uint64, p SplitProgress) commitVerdict {
	switch {
	case cur == nil:
		return verdictFenced
	case cur.owner() != self || cur.Epoch != epoch || cur.Status != statusRunnable && !cur.Completed:
		return verdictFenced
	case cur.Watermark != nil && *cur.Watermark == p.Watermark && cur.Completed == p.Completed && bytes.Equal(cur.State, p.State) && bytes.Equal(cur.Output, p.Output):
		return verdictLanded
	case cur.Completed:
		return verdictLanded
	case cur.Watermark != nil && p.Watermark < *cur.Watermark:
		return verdictRegress
	}
	return verdictRetry
}

func (a *actor) commitDone(cmd *command, t *tenancy, out commitOut, since uint64, checked bool, try int) error {
	id, p := cmd.split.id, cmd.progress
	reply := func(err error) error {
		cmd.reply <- err
		return nil
	}
	fatal := func(err error) error {
		// Sticky before the reply: the caller's next commit may take the
		// fast path (fence.go), which does not pass through the loop that
		// is about to stop.
		a.c.fail(err)
		cmd.reply <- err
		return err
	}
	if out.err != nil {
		if isDamage(out.err) {
			a.damage(id, prefixSplit+id, 0, out.err)
			return reply(Fencedf("split %s: its progress record became unreadable (%v); nothing was written", id, out.err))
		}
		if KindOf(out.err) == KindFatal {
			return fatal(out.err)
		}
		if checked {
			return reply(fmt.Errorf("commit %s: checking a watermark regression: %w", id, out.err))
		}
		if out.read {
			return reply(fmt.Errorf("commit %s: compare-and-swap lost and the re-read failed: %w", id, out.err))
		}
		return reply(fmt.Errorf("commit %s: %w", id, out.err))
	}
	if out.cur != nil {
		a.upsert(id, out.cur, out.rev, readSince(since))
	}
	if checked {
		if _, still := a.owned[id]; !still {
			return reply(notHeld(id))
		}
		if err := checkMonotone(id, a.splits[id].prog.Watermark, p.Watermark); err != nil {
			return fatal(err)
		}
		return a.startCommit(cmd, true, try)
	}
	if out.won {
		a.committed(id, t, out.rec, out.rev)
		return reply(nil)
	}
	cur := out.cur
	switch lostCommitVerdict(cur, a.self, t.epoch, p) {
	case verdictLanded:
		a.committed(id, t, cur, out.rev)
		return reply(nil)
	case verdictRegress:
		return fatal(checkMonotone(id, cur.Watermark, p.Watermark))
	case verdictRetry:
		if try == 0 {
			return a.startCommit(cmd, true, 1)
		}
	}
	if t2, still := a.owned[id]; still && t2 == t {
		a.dropLost(id, "fenced", "a commit lost its compare-and-swap")
	}
	return reply(Fencedf("split %s: the commit lost its compare-and-swap (another owner took it); nothing was written", id))
}

func (a *actor) committed(id string, t *tenancy, rec *progressRecord, rev uint64) {
	if r, ok := a.revocations[id]; ok {
		r.lastProgress = time.Now()
	}
	a.upsert(id, rec, rev, live)
	if rec.Completed {
		if t2, ok := a.owned[id]; ok && t2 == t {
			leaseRev := a.leave(id)
			a.settle(id, "drained")
			a.dropLeaseAsync(id, leaseRev, t.epoch)
		}
	}
}

// leave takes a split out of the owned set and stops renewing its lease;
// it returns the lease's last revision.
func (a *actor) leave(id string) uint64 {
	delete(a.owned, id)
	a.scopeDirty = true
	a.closeCell(id)
	return a.renew.release(id)
}

// ----- fail -----------------------------------------------------------------------

// failSplit consumes one delivery attempt and hands the split back; at the
// cap it quarantines it instead (epoch bumped to fence any zombie).
func (a *actor) failSplit(cmd *command) error {
	id := cmd.split.id
	t, held := a.owned[id]
	if !held {
		cmd.reply <- notHeld(id)
		return nil
	}
	a.m.failures.Inc()
	v := a.splits[id]
	rec := v.prog.clone()
	rec.Attempts++
	rec.Owner = nil
	rec.LastFailure = failureText(cmd.reason)
	quarantined := int(rec.Attempts) >= a.cfg.MaxAttempts
	if quarantined {
		rec.Status = statusQuarant
		rec.Epoch++
	}
	rec.WrittenAtMs = nowMs()
	baseRev := v.progRev
	a.splitIO(id, func(ctx context.Context) func() error {
		o, err := a.st.Update(ctx, Durable, prefixSplit+id, encode(rec), baseRev)
		return func() error {
			if err != nil {
				a.m.writes.WithLabelValues("error").Inc()
				cmd.reply <- fmt.Errorf("fail %s: %w", id, err)
				return nil
			}
			if !o.Won {
				a.m.writes.WithLabelValues("conflict").Inc()
				if t2, still := a.owned[id]; still && t2 == t {
					a.dropLost(id, "fenced", "a failure report lost its compare-and-swap")
				}
				cmd.reply <- Fencedf("split %s: the failure report lost its compare-and-swap; nothing was written", id)
				return nil
			}
			a.m.writesOK.Inc()
			// Leave the owned set before folding, so the epoch bump is not
			// read as a foreign fence. No Lost: the source asked for this.
			leaseRev := a.leave(id)
			a.settle(id, "forced")
			if quarantined {
				a.m.quarantines.Inc()
			}
			a.upsert(id, rec, o.Revision, live)
			a.dropLeaseAsync(id, leaseRev, t.epoch)
			a.log.Warn("split failed by the source", "split", id, "reason", cmd.reason, "attempts", rec.Attempts, "quarantined", quarantined)
			cmd.reply <- nil
			return nil
		}
	})
	return nil
}

// ----- release ----------------------------------------------------------------------

type releaseResult uint8

const (
	releaseNotHeld releaseResult = iota
	releaseWon
	releaseFenced
	releaseFailed
)

// release hands the command's splits back, concurrently, and replies once
// every one has been handed back or found gone.
func (a *actor) release(cmd *command) error {
	drained := cmd.kind == cmdReleaseDrained
	pending, released := len(cmd.splits), 0
	// While the splits are being handed back, nothing re-claims them (the
	// assignment may still name them here), and a source handing splits
	// back outside a drain (it is leaving) claims nothing new meanwhile.
	for _, s := range cmd.splits {
		a.handingBack[s.id]++
		a.scopeDirty = true
	}
	if !drained {
		a.undrained++
	}
	finish := func() {
		for _, s := range cmd.splits {
			if a.handingBack[s.id]--; a.handingBack[s.id] <= 0 {
				delete(a.handingBack, s.id)
				a.scopeDirty = true
			}
		}
		if !drained {
			a.undrained--
		}
		a.m.releases.Add(float64(released))
		// A departure is judged on what was asked, not on what landed; a
		// drained hand-back is never one.
		if !drained && len(cmd.splits) > 0 && len(a.owned) == 0 {
			a.part()
		}
		cmd.reply <- nil
	}
	if pending == 0 {
		finish()
		return nil
	}
	for _, s := range cmd.splits {
		err := a.onSplit(s.id, func() error {
			return a.releaseSplit(s.id, func(r releaseResult) {
				if r == releaseWon {
					released++
				}
				if pending--; pending == 0 {
					finish()
				}
			})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// surrender ends a release whose write failed: the split is not pinned
// here (its owner stays set, so the next claim is the conservative kind).
func (a *actor) surrender(id string, err error, done func(releaseResult)) {
	a.settle(id, "forced")
	a.log.Warn("release write failed; surrendering the split anyway", "split", id, "err", err)
	done(releaseFailed)
}

// fencedRelease ends a release whose compare-and-swap lost: the record
// moved, so the split is no longer this worker's.
func (a *actor) fencedRelease(id string, done func(releaseResult)) {
	a.m.writes.WithLabelValues("conflict").Inc()
	a.dropLost(id, "fenced", "its record moved before the release")
	done(releaseFenced)
}

// releaseSplit hands one held split back: owner cleared, epoch unchanged,
// lease deleted so peers claim at once. done runs on the loop with the
// outcome.
func (a *actor) releaseSplit(id string, done func(releaseResult)) error {
	t, held := a.owned[id]
	if !held {
		done(releaseNotHeld)
		return nil
	}
	v := a.splits[id]
	rec := v.prog.clone()
	rec.Owner = nil
	rec.WrittenAtMs = nowMs()
	baseRev := v.progRev
	if a.rel != nil && !a.stopping {
		a.releaseAtomic(id, t, rec, baseRev, done)
		return nil
	}
	a.splitIO(id, func(ctx context.Context) func() error {
		o, err := a.st.Update(ctx, Durable, prefixSplit+id, encode(rec), baseRev)
		return func() error {
			t2, still := a.owned[id]
			still = still && t2 == t
			switch {
			case err != nil:
				// Surrender it anyway: the owner stays set, so the next
				// claim is the conservative kind, but the split is not
				// pinned here.
				a.m.writes.WithLabelValues("error").Inc()
				if a.stopping || a.ctx.Err() != nil {
					// The coordinator is closing and cancelled the write:
					// keep the tenancy, so that Close hands it back
					// directly.
					done(releaseFailed)
					return nil
				}
				if still {
					a.dropLeaseAsync(id, a.leave(id), t.epoch)
				}
				a.surrender(id, err, done)
			case !o.Won:
				a.fencedRelease(id, done)
			default:
				a.m.writesOK.Inc()
				leaseRev := uint64(0)
				if still {
					leaseRev = a.leave(id)
				}
				a.upsert(id, rec, o.Revision, live)
				a.dropLeaseAsync(id, leaseRev, t.epoch)
				a.settle(id, "drained")
				done(releaseWon)
			}
			return nil
		}
	})
	return nil
}

// releaseAtomic is releaseSplit on a store with the [Releaser] capability:
// the owner-clear and the lease delete in one call.
//
// The renewer stops renewing the lease before the call, so that no
// renewal starts that the delete would turn into a reported loss. A
// renewal already in flight may still land first and move the lease's
// revision: the delete then loses its guard while the owner-clear wins,
// and the plain path's delete (deleteOwnLease: re-read, delete if still
// ours) finishes the job. A renewal that lands after the delete finds the
// key gone and, the renewer no longer holding it, reports nothing. While
// the call is in flight the tenancy is marked releasing: the watches may
// show the lease deleted, or a peer's claim after it, before the answer is
// folded, and they must not end the tenancy as lost (dropLost waits).
func (a *actor) releaseAtomic(id string, t *tenancy, rec *progressRecord, baseRev uint64, done func(releaseResult)) {
	h, renewing := a.renew.take(id)
	leaseRev := h.rev
	key := prefixSplit + id
	t.releasing = true
	a.splitIO(id, func(ctx context.Context) func() error {
		u, d, err := a.rel.UpdateAndDelete(ctx, key, encode(rec), baseRev, key, leaseRev)
		return func() error {
			t.releasing = false
			t2, still := a.owned[id]
			still = still && t2 == t
			switch {
			case err != nil:
				a.m.writes.WithLabelValues("error").Inc()
				if a.stopping || a.ctx.Err() != nil {
					// As on the plain path: keep the tenancy, renewed,
					// so that Close hands it back directly.
					if still && renewing {
						a.renew.hold(id, h.epoch, h.rev, h.lastOK, h.sess)
					}
					done(releaseFailed)
					return nil
				}
				if still {
					// Both writes or neither landed: the delete below
					// finds out which.
					a.leave(id)
					a.dropLeaseAsync(id, leaseRev, t.epoch)
				}
				a.surrender(id, err, done)
			case !u.Won:
				a.fencedRelease(id, done)
			default:
				a.m.writesOK.Inc()
				if still {
					a.leave(id)
				}
				a.upsert(id, rec, u.Revision, live)
				switch {
				case d.Won:
					if v := a.splits[id]; v != nil && v.lease != nil && v.leaseRev == leaseRev {
						v.lease = nil
						a.dirty = true
					}
				case still:
					// The lease was not at leaseRev: a renewal in flight
					// moved it, or it expired. Delete it if it is still
					// ours.
					a.dropLeaseAsync(id, leaseRev, t.epoch)
				}
				a.settle(id, "drained")
				done(releaseWon)
			}
			return nil
		}
	})
}

// ----- decline, depart ---------------------------------------------------------------

func (a *actor) decline(id string) error {
	r, ok := a.revocations[id]
	if !ok {
		return nil
	}
	if r.cancelled {
		delete(a.revocations, id) // nothing to comply with: the split stays
		return nil
	}
	if r.forcing {
		return nil // already forced
	}
	a.log.Debug("revocation declined by the source; forcing it", "split", id)
	return a.force(id)
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
	a.deleteKey(Ephemeral, prefixWorker+a.self, a.renew.stopPresence())
	a.log.Info("leaving the fleet", "still_held", len(a.owned))
}

// ----- leaving a tenancy involuntarily ----------------------------------------------

// dropLost ends a tenancy involuntarily: it leaves the durable record and
// the lease alone, settles any revocation as forced and emits Lost.
func (a *actor) dropLost(id, reason, why string) {
	t, held := a.owned[id]
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
		a.selfFenced[id] = t.epoch
	}
	a.settle(id, "forced")
	a.m.losses.WithLabelValues(reason).Inc()
	a.log.Warn("split lost", "split", id, "reason", reason, "why", why)
	a.c.emit(Lost{Split: SplitID{id: id}})
}
