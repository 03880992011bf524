package spate

import "context"

// verdict is a bounded job's terminal state.
type verdict uint8

const (
	verdictNone        verdict = iota // still running
	verdictAllComplete                // every split completed
	verdictStalled                    // the rest are quarantined
)

// judgeTerminal is the pure terminal rule, judged on a listing of the
// split records (never the watch-fed view or the planned count alone: a
// subset that happens to be complete must never report success). The plan
// must be final, the listing must hold at least the planned count and
// every split the view knows of (a record the view holds but the listing
// lacks was deleted: no verdict), and every listed split must be completed
// (AllComplete) or completed or quarantined with at least one quarantined
// (Stalled).
func judgeTerminal(final bool, planned uint64, known int, listed []*progressRecord) (v verdict, completed, quarantined int) {
	for _, r := range listed {
		switch r.Status {
		case statusCompleted:
			completed++
		case statusQuarant:
			quarantined++
		}
	}
	n := len(listed)
	switch {
	case !final || uint64(n) < planned || n < known:
		return verdictNone, completed, quarantined
	case completed == n:
		return verdictAllComplete, completed, quarantined
	case completed+quarantined == n:
		return verdictStalled, completed, quarantined
	}
	return verdictNone, completed, quarantined
}

// detectTerminal latches AllComplete or Stalled. When the view says the
// job may be over, it lists the split records beside the loop and judges
// the listing.
func (a *actor) detectTerminal() {
	if a.terminal || a.terminalBusy || a.plan == nil || a.plan.Finality != finalityFinal {
		return
	}
	if uint64(a.nSplits) < a.plan.Planned || a.nCompleted+a.nQuarant != a.nSplits {
		return
	}
	if a.terminalAt != 0 && a.terminalAt == a.durableSeq {
		return // nothing changed since the last authoritative check
	}
	a.terminalBusy = true
	a.terminalAt = a.durableSeq
	since := a.mark()
	a.spawn(func(ctx context.Context) func() error {
		entries, err := a.st.List(ctx, Durable, prefixSplit)
		return func() error {
			a.terminalBusy = false
			if err != nil {
				a.log.Debug("terminal check deferred: listing failed", "err", err)
				a.terminalAt = 0
				a.failed(opKey{op: "terminal"})
				return nil
			}
			listed := make([]*progressRecord, 0, len(entries))
			for _, e := range entries {
				id := e.Key[len(prefixSplit):]
				r, err := decodeProgress(e.Key, id, e.Value, a.fpHash)
				if err != nil {
					return err
				}
				a.upsert(id, r, e.Revision, readSince(since))
				listed = append(listed, r)
			}
			a.terminalAt = a.durableSeq
			if a.terminal {
				return nil
			}
			v, completed, quarantined := judgeTerminal(a.plan.Finality == finalityFinal, a.plan.Planned, a.nSplits, listed)
			switch v {
			case verdictAllComplete:
				a.terminal = true
				a.log.Info("job complete: every split is completed", "splits", len(listed))
				a.c.emit(AllComplete{})
			case verdictStalled:
				a.terminal, a.stalled = true, true
				a.log.Warn("job stalled: the remaining splits are quarantined", "completed", completed, "quarantined", quarantined)
				a.c.emit(Stalled{Completed: uint64(completed), Quarantined: uint64(quarantined)})
			}
			return nil
		}
	})
}

// withdrawStall lifts a latched Stalled verdict when a quarantined split
// is made runnable again (an operator's requeue): the worker takes part
// again, so the split is assigned and claimed without a restart. A later
// verdict is judged afresh. AllComplete is never withdrawn.
func (a *actor) withdrawStall(id string) {
	if !a.terminal || !a.stalled {
		return
	}
	a.terminal, a.stalled = false, false
	a.terminalAt = 0
	a.dirty = true
	a.log.Info("stall withdrawn: a quarantined split is runnable again", "split", id)
}
