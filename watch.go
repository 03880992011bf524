package spate

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// watchSet is how this worker follows the job: the two whole-job watch
// streams (one per keyspace), or, for a worker that watches only its own
// splits' keys (watchscope.go), the key groups over them.
type watchSet struct {
	streams        [2]*watchState // the whole-job watches, by keyspace
	fullView       bool           // the whole-job watches' snapshots are in: the view is the whole job
	rewatchPending bool           // a re-watch is scheduled (rewatch)
	rewatch        *time.Timer
	// rewatchJitter bounds the random share of the wait before one
	// re-watch, added to rewatchDelay. Meanwhile the renewer keeps the
	// leases and the fence cells keep commits going; only the view waits.
	rewatchJitter time.Duration

	keyScope   // the scoped mode's key groups (watchscope.go)
	keyEvents  chan keyEvent
	scopeDirty bool // the scope may have changed: rescope

	reconciling bool // a reconcile listing is in flight (reconcile)

	failLog watchFailLog // failed (re-)watches, said once then rate-limited
}

// newWatchSet returns a worker's watches, none open yet. Without key
// watches (scoped is false) every worker watches the whole job from
// startup on (which completes both snapshots before the loop runs).
func newWatchSet(rewatchJitter time.Duration, scoped bool) watchSet {
	ws := watchSet{
		streams:       [2]*watchState{{ks: Ephemeral}, {ks: Durable}},
		fullView:      !scoped,
		rewatch:       time.NewTimer(time.Hour),
		rewatchJitter: rewatchJitter,
		keyScope:      newKeyScope(),
		keyEvents:     make(chan keyEvent, stepBatch),
	}
	ws.rewatch.Stop()
	return ws
}

// rewatchDelay is the least the actor waits before re-establishing a
// broken watch.
const rewatchDelay = 200 * time.Millisecond

// watchState is one keyspace's watch.
type watchState struct {
	ks         Keyspace
	ch         <-chan WatchEvent // nil while down
	cancel     context.CancelFunc
	opening    bool      // establishment in flight
	collecting bool      // between (re)establishment and SnapshotDone
	since      uint64    // loop clock when the watch was opened
	deadline   time.Time // the snapshot must be complete by then
	snapshot   []Entry
}

// openWatch establishes w's stream beside the loop; its snapshot then
// arrives through the loop's select like any event.
func (a *actor) openWatch(w *watchState) {
	if w.ch != nil || w.opening {
		return
	}
	w.opening = true
	since := a.job.mark()
	a.spawn(func(ctx context.Context) func() error {
		wctx, cancel := context.WithCancel(ctx)
		ch, err := a.st.Watch(wctx, w.ks, "")
		return func() error {
			w.opening = false
			if err == nil && !a.wantWholeJob() {
				cancel() // leadership went meanwhile: this worker watches its keys
				return nil
			}
			if err != nil {
				cancel()
				if kindOf(err) == kindFatal {
					return fmt.Errorf("watch %s: %w", w.ks, err)
				}
				a.w.failLog.fail(a.log, "re-watch failed; retrying", "keyspace", w.ks, "err", err)
				a.w.rewatchSoon()
				return nil
			}
			w.ch, w.cancel, w.collecting, w.snapshot = ch, cancel, true, nil
			w.since, w.deadline = since, time.Now().Add(a.c.tm.snapshotBudget)
			a.w.failLog.ok(a.log)
			return nil
		}
	})
}

func (w *watchState) close() {
	if w.cancel != nil {
		w.cancel()
	}
	w.ch, w.cancel, w.collecting, w.snapshot = nil, nil, false, nil
}

// rewatchSoon schedules a jittered re-establishment of what broke.
func (ws *watchSet) rewatchSoon() {
	ws.rewatchPending = true
	ws.rewatch.Reset(rewatchDelay + rand.N(ws.rewatchJitter))
}

// closeStreams ends the whole-job watches: the view is no longer the
// whole job.
func (ws *watchSet) closeStreams() {
	for _, w := range ws.streams {
		w.close()
	}
	ws.fullView = false
}

// reestablish reopens what is down: the whole-job watches, or on a
// scoped worker the key groups (at its next step).
func (a *actor) reestablish() {
	a.w.rewatchPending = false
	if !a.wantWholeJob() {
		a.w.scopeDirty = true
		return
	}
	for _, w := range a.w.streams {
		a.openWatch(w)
	}
}

// expireSnapshots gives up on every snapshot (a whole-job watch's or a
// key group's) that did not complete by its deadline, and schedules a
// re-watch. budget is the snapshot budget, for the log.
func (ws *watchSet) expireSnapshots(now time.Time, log *slog.Logger, budget time.Duration) {
	expired := false
	for _, w := range ws.streams {
		if w.collecting && now.After(w.deadline) {
			log.Warn("watch snapshot not complete in time; re-watching", "keyspace", w.ks, "budget", budget)
			w.close()
			expired = true
		}
	}
	for g := range ws.groups {
		if g.collecting && now.After(g.deadline) {
			log.Warn("key watch snapshot not complete in time; re-watching", "keyspace", g.ks, "keys", len(g.keys), "budget", budget)
			ws.dropGroup(g)
			expired = true
		}
	}
	if expired {
		ws.rewatchSoon()
	}
}

// onWatch handles one watch item.
func (a *actor) onWatch(w *watchState, ev WatchEvent, ok bool) error {
	if !ok || ev.Kind == WatchError {
		if ok {
			a.log.Warn("watch broke; re-watching", "keyspace", w.ks, "err", ev.Err)
		} else {
			a.log.Warn("watch ended; re-watching", "keyspace", w.ks)
		}
		w.close()
		if ok && kindOf(ev.Err) == kindFatal {
			return fmt.Errorf("watch %s: %w", w.ks, ev.Err)
		}
		a.w.rewatchSoon()
		return nil
	}
	if w.collecting {
		switch ev.Kind {
		case WatchPut:
			w.snapshot = append(w.snapshot, Entry{Key: ev.Key, Value: ev.Value, Revision: ev.Revision})
		case WatchSnapshotDone:
			snap := w.snapshot
			w.collecting, w.snapshot = false, nil
			a.worker.ownDirty = true
			var err error
			if w.ks == Ephemeral {
				err = a.applyEphemeral(snap, w.since)
			} else {
				err = a.applyDurable(snap, w.since, false)
			}
			a.noteFullView()
			return err
		}
		return nil // deletes inside a snapshot are dropped
	}
	return a.applyLive(w.ks, ev)
}

// applyLive folds one live put or delete of keyspace ks, from a whole-job
// watch or a key group.
func (a *actor) applyLive(ks Keyspace, ev WatchEvent) error {
	switch ev.Kind {
	case WatchPut:
		if ks == Ephemeral {
			return a.ephemeralPut(ev.Key, ev.Value, ev.Revision)
		}
		return a.durablePut(ev.Key, ev.Value, ev.Revision, live)
	case WatchDelete:
		if ks == Ephemeral {
			a.ephemeralDelete(ev.Key, ev.Revision, false)
		} else {
			return a.durableDelete(ev.Key, ev.Revision)
		}
	}
	return nil
}

// noteFullView marks the view whole once both whole-job watches have
// delivered their snapshots: only then may a leader act on it.
func (a *actor) noteFullView() {
	for _, w := range a.w.streams {
		if w.ch == nil || w.collecting {
			return
		}
	}
	if !a.w.fullView {
		a.w.fullView = true
		a.dirty = true
		if a.leader.term != nil {
			a.members.inferDeparted(a.job.splits, time.Now(), a.cfg.RebalanceDelay, a.log)
		}
	}
}

// ----- the listing backstop -------------------------------------------------------

// reconcile lists both keyspaces beside the loop, as the backstop for
// missed watch events: a key the view holds from before the listing began
// and the listing does not have is gone. One reconcile at a time.
func (a *actor) reconcile() {
	// Delay windows elapse on time, not events; this also retries failed
	// assignment writes.
	a.dirty = true
	if a.w.reconciling {
		return
	}
	a.w.reconciling = true
	since := a.job.mark()
	a.spawn(func(ctx context.Context) func() error {
		start := time.Now()
		eph, errE := a.st.List(ctx, Ephemeral, "")
		dur, errD := a.st.List(ctx, Durable, "")
		a.m.reconcileDur.Observe(time.Since(start).Seconds())
		return func() error {
			a.w.reconciling = false
			if errE != nil {
				a.log.Warn("reconcile: listing the ephemeral keyspace failed", "err", errE)
			} else if err := a.applyEphemeral(eph, since); err != nil {
				return err
			}
			if errD != nil {
				a.log.Warn("reconcile: listing the durable keyspace failed", "err", errD)
			} else if err := a.applyDurable(dur, since, true); err != nil {
				return err
			}
			a.findUnseeded()
			a.dirty = true
			return nil
		}
	})
}

// findUnseeded, on the leader of a final plan, finds splits whose spec is
// there but whose progress record is not: seeding writes the spec first,
// and a final plan is published only after its seeding finished, so such
// a split was damaged (its record deleted before this worker ever saw it).
// Its record is re-seeded from nothing (a planner's seed progress is lost:
// the split replays from its start — duplicates, never loss).
func (a *actor) findUnseeded() {
	if a.leader.term == nil || !a.w.fullView || a.planning.plan == nil || a.planning.plan.Finality != finalityFinal {
		return
	}
	for id, v := range a.job.splits {
		if v.spec != nil && v.prog == nil && a.records.missing[id] == nil && !a.records.splitDamaged(id) {
			a.log.Warn("a planned split has a spec but no progress record; re-seeding it", "split", id)
			a.records.lost(id, newProgressRecord(id, a.fpHash, nil))
		}
	}
}
