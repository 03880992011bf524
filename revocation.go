package spate

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// revocationSet holds this worker's revocations in progress, by split, and
// owns their counting rule: "requested" each time the source is asked to
// drain a split, "cancelled" when the leader names the split here again,
// "forced" each time a forced hand-back starts (a failed one retried
// counts again), and otherwise the outcome it settles with ("drained").
// A cancelled or forced revocation settles without counting more.
type revocationSet struct {
	byID     map[string]*revocation
	outcomes *prometheus.CounterVec // revocations by outcome
	drainDur prometheus.Observer    // how long a drained revocation took
	log      *slog.Logger
}

func newRevocationSet(m *coordMetrics, log *slog.Logger) revocationSet {
	return revocationSet{byID: map[string]*revocation{}, outcomes: m.revocations, drainDur: m.drainDur, log: log}
}

// begin revokes held split id (tenancy t) at now. It reports whether the
// source is to be asked to drain it: not while a forced release of it is
// under way (asked once). A withdrawn revocation revoked again keeps its
// original anchor, so one already past its deadline is forced at once.
func (rs *revocationSet) begin(id string, t *tenancy, now time.Time) bool {
	if r, ok := rs.byID[id]; ok {
		if r.forcing {
			return false
		}
		r.cancelled = false
	} else {
		rs.byID[id] = &revocation{started: now, lastProgress: now, t: t}
	}
	rs.outcomes.WithLabelValues("requested").Inc()
	rs.log.Debug("drain started", "split", id)
	return true
}

// pending reports whether split id has a revocation the leader has not
// withdrawn.
func (rs *revocationSet) pending(id string) bool {
	r, ok := rs.byID[id]
	return ok && !r.cancelled
}

// withdraw cancels the revocation of split id (the leader named it here
// again) at now, unless it is cancelled already or being forced.
func (rs *revocationSet) withdraw(id string, now time.Time) {
	r, ok := rs.byID[id]
	if !ok || r.cancelled || r.forcing {
		return
	}
	r.cancelled = true
	r.lastProgress = now
	rs.outcomes.WithLabelValues("cancelled").Inc()
	rs.log.Debug("revocation cancelled: the leader named the split here again", "split", id)
}

// progressed notes a commit of split id at now: a withdrawn revocation's
// silence timer starts again.
func (rs *revocationSet) progressed(id string, now time.Time) {
	if r, ok := rs.byID[id]; ok {
		r.lastProgress = now
	}
}

// force marks split id's revocation as forced, counting it. It reports
// whether a forced release is to start: not when one is under way.
func (rs *revocationSet) force(id string) bool {
	r, ok := rs.byID[id]
	if !ok {
		return true // a release without a revocation (none to count)
	}
	if r.forcing {
		return false
	}
	r.forcing = true
	if !r.cancelled {
		rs.outcomes.WithLabelValues("forced").Inc()
	}
	return true
}

// forceEnded records how split id's forced release ended: the entry stays,
// to be forced again when due but not asked again, only if the release
// failed and the split is still held.
func (rs *revocationSet) forceEnded(id string, stillHeld bool) {
	if r, ok := rs.byID[id]; ok && r.forcing {
		if stillHeld {
			r.forcing = false
		} else {
			delete(rs.byID, id)
		}
	}
}

// settle ends split id's revocation with outcome. A cancelled or forced
// entry counted already and counts nothing more.
func (rs *revocationSet) settle(id, outcome string) {
	r, ok := rs.byID[id]
	if !ok {
		return
	}
	delete(rs.byID, id)
	if r.cancelled || r.forcing {
		return
	}
	rs.outcomes.WithLabelValues(outcome).Inc()
	if outcome == "drained" {
		took := time.Since(r.started)
		rs.drainDur.Observe(took.Seconds())
		rs.log.Debug("drain finished", "split", id, "took", took)
	}
}

// decline handles the source declining split id's revocation: it reports
// whether the revocation is to be forced. A withdrawn revocation just ends
// (nothing to comply with: the split stays); a forced one is under way
// already.
func (rs *revocationSet) decline(id string) bool {
	r, ok := rs.byID[id]
	switch {
	case !ok:
		return false
	case r.cancelled:
		delete(rs.byID, id)
		return false
	}
	return !r.forcing
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
	for _, id := range slices.Sorted(maps.Keys(a.worker.revocations.byID)) {
		r := a.worker.revocations.byID[id]
		if t, held := a.worker.owned[id]; !held || r.t != nil && t != r.t {
			a.worker.revocations.settle(id, "forced") // its tenancy ended
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
	if !a.worker.revocations.force(id) {
		return nil
	}
	return a.onSplit(id, func() error {
		return a.releaseSplit(id, func(r releaseResult) {
			_, held := a.worker.owned[id]
			a.worker.revocations.forceEnded(id, held && r == releaseFailed)
			if r != releaseFenced && r != releaseNotHeld {
				a.m.losses.WithLabelValues("revoked").Inc()
				a.c.emit(Lost{Split: SplitID{id: id}})
			}
		})
	})
}

// decline forces a revocation the source declined.
func (a *actor) decline(id string) error {
	if !a.worker.revocations.decline(id) {
		return nil
	}
	a.log.Debug("revocation declined by the source; forcing it", "split", id)
	return a.force(id)
}
