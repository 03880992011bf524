package spate

import (
	"context"
	"maps"
	"slices"
	"time"
)

// DeclineRevoke implements [SplitCoordinator]. Errors are logged, not
// returned: the drain deadline forces the release anyway.
func (c *StoreCoordinator) DeclineRevoke(ctx context.Context, split SplitID) error {
	if err := c.do(ctx, &command{kind: cmdDecline, split: split}); err != nil {
		c.log.Warn("revocation decline did not reach the actor; the drain deadline will force it", "split", split, "err", err)
	}
	return nil
}

// revocation is a cooperative revocation in progress on this worker: the
// leader no longer names a held split here, the source was asked to drain
// it, and the release is forced at the drain deadline.
type revocation struct {
	started      time.Time
	lastProgress time.Time
	cancelled    bool // the leader named the split here again
	// forcing: the hand-back is forced (declined, or past its deadline) and
	// its release is under way for tenancy t. The entry stays until that
	// tenancy ends, so the revocation is not asked of the source again: a
	// declined revocation re-asked on every pass was a hot loop of
	// hundreds of RevokeRequested per revocation.
	forcing bool
	t       *tenancy
}

func (a *actor) beginRevocation(id string, now time.Time) {
	if r, ok := a.worker.revocations[id]; ok {
		if r.forcing {
			return // asked once; the release is under way
		}
		r.cancelled = false // keeps its original anchor: past-deadline forces at once
	} else {
		a.worker.revocations[id] = &revocation{started: now, lastProgress: now, t: a.worker.owned[id]}
	}
	a.m.revocations.WithLabelValues("requested").Inc()
	a.log.Debug("drain started", "split", id)
	a.c.emit(RevokeRequested{Split: SplitID{id: id}})
}

// withdrawRevocations cancels the revocations of splits the leader named
// here again.
func (a *actor) withdrawRevocations(now time.Time) {
	for id, r := range a.worker.revocations {
		if _, held := a.worker.owned[id]; !r.cancelled && !r.forcing && held && a.worker.assigned[id] {
			r.cancelled = true
			r.lastProgress = now
			a.m.revocations.WithLabelValues("cancelled").Inc()
			a.log.Debug("revocation cancelled: the leader named the split here again", "split", id)
		}
	}
}

// revocationDue is the pure deadline rule: a revocation is forced once its
// drain has run for the deadline; a withdrawn one whose drain has committed
// nothing for the deadline is released too (a silence timeout).
func revocationDue(r *revocation, deadline time.Duration, now time.Time) bool {
	if r.cancelled {
		return now.Sub(r.lastProgress) >= deadline
	}
	return now.Sub(r.started) >= deadline
}

func (a *actor) serviceRevocations(now time.Time) error {
	for _, id := range slices.Sorted(maps.Keys(a.worker.revocations)) {
		r := a.worker.revocations[id]
		if t, held := a.worker.owned[id]; !held || r.t != nil && t != r.t {
			a.settle(id, "forced") // its tenancy ended
			continue
		}
		if r.forcing {
			continue // the release is under way
		}
		if a.io.busy[id] || a.io.committing(id) || !revocationDue(r, a.cfg.DrainDeadline, now) {
			continue
		}
		if r.cancelled {
			a.log.Warn("a withdrawn revocation's drain stopped committing; releasing the split", "split", id, "silence", a.cfg.DrainDeadline)
		} else {
			a.log.Warn("revocation forced: the drain did not finish within the deadline; its uncommitted tail replays", "split", id, "deadline", a.cfg.DrainDeadline)
		}
		if err := a.force(id); err != nil {
			return err
		}
	}
	return nil
}

// force releases a revoked split now (owner cleared: the next claim is
// attempt-free; being revoked is not poison evidence).
func (a *actor) force(id string) error {
	if r, ok := a.worker.revocations[id]; ok {
		if r.forcing {
			return nil
		}
		r.forcing = true
		if !r.cancelled {
			a.m.revocations.WithLabelValues("forced").Inc()
		}
	}
	return a.onSplit(id, func() error {
		return a.releaseSplit(id, func(r releaseResult) {
			if rv, ok := a.worker.revocations[id]; ok && rv.forcing {
				if _, held := a.worker.owned[id]; held && r == releaseFailed {
					rv.forcing = false // still held: forced again when due, not asked again
				} else {
					delete(a.worker.revocations, id)
				}
			}
			if r != releaseFenced && r != releaseNotHeld {
				a.m.losses.WithLabelValues("revoked").Inc()
				a.c.emit(Lost{Split: SplitID{id: id}})
			}
		})
	})
}

// settle ends a revocation entry with an outcome. Cancelled entries already
// counted "cancelled" and count nothing more.
func (a *actor) settle(id, outcome string) {
	r, ok := a.worker.revocations[id]
	if !ok {
		return
	}
	delete(a.worker.revocations, id)
	if r.cancelled || r.forcing {
		return // counted already
	}
	a.m.revocations.WithLabelValues(outcome).Inc()
	if outcome == "drained" {
		a.m.drainDur.Observe(time.Since(r.started).Seconds())
		a.log.Debug("drain finished", "split", id, "took", time.Since(r.started))
	}
}

func (a *actor) decline(id string) error {
	r, ok := a.worker.revocations[id]
	if !ok {
		return nil
	}
	if r.cancelled {
		delete(a.worker.revocations, id) // nothing to comply with: the split stays
		return nil
	}
	if r.forcing {
		return nil // already forced
	}
	a.log.Debug("revocation declined by the source; forcing it", "split", id)
	return a.force(id)
}
