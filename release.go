package spate

import (
	"context"
	"maps"
	"slices"
)

// Handing splits back. Release hands back a tenancy the source is done
// with (its last commit stays; the next owner resumes from it),
// ReleaseDrained one whose revocation drained, and Depart takes this worker
// out of the fleet (no claims, no elections, presence given up) while it
// keeps what it holds until it releases it. On Close the splits still held
// are handed back directly (directRelease). A release is one store call
// where the store can do it (a compare-and-swap and the lease's delete in
// one write, releaseAtomic) and blocks re-claims of what it hands back.

// Release implements [SplitCoordinator]. It is best effort: when the actor
// is alive but slow it returns nil (the queued release may still run, and
// Close hands back what is still held); when the actor is gone it releases
// directly.
func (c *StoreCoordinator) Release(ctx context.Context, splits ...SplitID) error {
	err := c.do(ctx, &command{kind: cmdRelease, splits: splits})
	if err == nil {
		return nil
	}
	select {
	case <-c.done:
		if c.act != nil {
			c.directRelease(splits)
		}
	default:
		// The command stays queued: the actor may still run it, and
		// Close hands back whatever is still held (directRelease). The
		// leases expire only if this process stops renewing them.
		c.log.Warn("release did not complete in time; it stays queued, and Close hands back what is still held", "splits", len(splits), "err", err)
	}
	return nil
}

// Depart implements [SplitCoordinator].
func (c *StoreCoordinator) Depart(ctx context.Context) error {
	return c.do(ctx, &command{kind: cmdDepart})
}

// ReleaseDrained implements [SplitCoordinator]. Errors are logged, not
// returned: the leader forces the release at the drain deadline anyway.
func (c *StoreCoordinator) ReleaseDrained(ctx context.Context, splits ...SplitID) error {
	if err := c.do(ctx, &command{kind: cmdReleaseDrained, splits: splits}); err != nil {
		c.log.Warn("drained release did not complete; the revocation deadline will force it", "splits", len(splits), "err", err)
	}
	return nil
}

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
		a.worker.handBack(s.id)
		a.w.scopeDirty = true
	}
	if !drained {
		a.worker.undrainedRelease(+1)
	}
	finish := func() {
		for _, s := range cmd.splits {
			if a.worker.handedBack(s.id) {
				a.w.scopeDirty = true
			}
		}
		if !drained {
			a.worker.undrainedRelease(-1)
		}
		a.m.releases.Add(float64(released))
		// A departure is judged on what was asked, not on what landed; a
		// drained hand-back is never one.
		if !drained && len(cmd.splits) > 0 && len(a.worker.owned) == 0 {
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
	a.worker.revocations.settle(id, "forced")
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
	t, held := a.worker.owned[id]
	if !held {
		done(releaseNotHeld)
		return nil
	}
	v := a.job.splits[id]
	rec := v.prog.clone()
	rec.Owner, rec.Parked = nil, false
	rec.WrittenAtMs = nowMs()
	baseRev := v.progRev
	if a.rel != nil && !a.io.stopping {
		a.releaseAtomic(id, t, rec, baseRev, done)
		return nil
	}
	a.splitIO(id, func(ctx context.Context) func() error {
		o, err := a.st.Update(ctx, Durable, prefixSplit+id, encode(rec), baseRev)
		return func() error {
			t2, still := a.worker.owned[id]
			still = still && t2 == t
			switch {
			case err != nil:
				// Surrender it anyway: the owner stays set, so the next
				// claim is the conservative kind, but the split is not
				// pinned here.
				a.m.writes.WithLabelValues("error").Inc()
				if a.closing() {
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
				a.worker.revocations.settle(id, "drained")
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
			t2, still := a.worker.owned[id]
			still = still && t2 == t
			switch {
			case err != nil:
				a.m.writes.WithLabelValues("error").Inc()
				if a.closing() {
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
					if v := a.job.splits[id]; v != nil && v.lease != nil && v.leaseRev == leaseRev {
						v.lease = nil
						a.dirty = true
					}
				case still:
					// The lease was not at leaseRev: a renewal in flight
					// moved it, or it expired. Delete it if it is still
					// ours.
					a.dropLeaseAsync(id, leaseRev, t.epoch)
				}
				a.worker.revocations.settle(id, "drained")
				done(releaseWon)
			}
			return nil
		}
	})
}

// part stops this worker taking part after it released its last split on
// shutdown: no claims, no elections, leadership and presence given up.
func (a *actor) part() {
	if !a.worker.part() {
		return
	}
	if a.leader.term != nil {
		// Leaving is not a loss: an operator has nothing to act on.
		a.log.Info("leadership given up: this worker is leaving the fleet")
		a.resign()
	}
	a.deleteKey(Ephemeral, prefixWorker+a.self, a.renew.stopPresence())
	a.log.Info("leaving the fleet", "still_held", len(a.worker.owned))
}

// directRelease hands splits back without the actor (it has exited; nil
// means every split it still held: Close), records a verdict this leader
// latched that its loop had no time to record (Close only), and deletes
// this process's presence and leader keys, so peers take over at once
// instead of waiting out the TTL. Concurrent calls (Close racing a Release) are serialised.
func (c *StoreCoordinator) directRelease(splits []SplitID) {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.tm.directRelease)
	defer cancel()
	a := c.act
	closing := splits == nil
	if closing {
		for _, id := range slices.Sorted(maps.Keys(a.worker.owned)) {
			splits = append(splits, SplitID{id: id})
		}
	}
	for _, s := range splits {
		t, ok := a.worker.owned[s.id]
		if !ok {
			continue
		}
		// As the loop releases: owner cleared first, then the lease, so a
		// peer that sees the lease vanish finds the split released, not
		// expired (which would cost it an attempt).
		key := prefixSplit + s.id
		if e, ok, err := c.store.Get(ctx, Durable, key); err == nil && ok {
			if r, err := decodeProgress(key, s.id, e.Value, a.fpHash); err == nil && r.owner() == a.self && r.Epoch == t.epoch {
				r.Owner, r.Parked = nil, false
				r.WrittenAtMs = nowMs()
				if o, err := c.store.Update(ctx, Durable, key, encode(r), e.Revision); err == nil && o.Won {
					c.m.releases.Inc()
				}
			}
		}
		deleteOwnLease(ctx, c.store, s.id, a.leave(s.id), a.self, c.nonce, t.epoch)
	}
	if closing {
		// Before the leader key goes: a successor must find the verdict
		// recorded, not judge the job afresh (terminal.go).
		c.recordVerdict(ctx)
	}
	for _, key := range []string{prefixWorker + a.self, keyLeader} {
		e, ok, err := c.store.Get(ctx, Ephemeral, key)
		if err != nil || !ok {
			continue
		}
		if ours(key, e.Value, a.self, c.nonce) {
			_, _ = c.store.Delete(ctx, Ephemeral, key, e.Revision)
		}
	}
	if ctx.Err() != nil {
		c.log.Warn("direct release ran out of time; unreleased leases will expire", "budget", c.tm.directRelease)
	}
}

// ours reports whether an ephemeral presence or leader value was written
// by this process.
func ours(key string, v []byte, self, nonce string) bool {
	if key == keyLeader {
		l, err := decodeLeader(v)
		return err == nil && l.Owner == self && l.Nonce == nonce
	}
	w, err := decodeWorker(key, v)
	return err == nil && w.Nonce == nonce
}
