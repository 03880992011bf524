package spate

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"
)

// verdictState is the job's terminal verdict as this worker knows it:
// what it judged from its own listings, and, for a worker that watches
// only its own keys, the leader's verdict record.
type verdictState struct {
	terminal bool        // a verdict is latched (AllComplete or Stalled emitted)
	stalled  bool        // the latched verdict is Stalled (withdrawn by a requeue)
	listedAt uint64      // durableSeq at the last terminal listing (0: list again)
	listing  bool        // a terminal listing is in flight
	judged   *verdictVal // the verdict latched from this worker's own listing

	record    *verdictVal // the leader's verdict record as last read (scoped workers)
	recordAt  uint64      // loop clock when record was set
	recordRev uint64      // the record's store revision
	syncing   bool        // the leader's write of the record is in flight
}

// verdict is a bounded job's terminal state.
type verdict uint8

const (
	verdictNone        verdict = iota // still running
	verdictAllComplete                // every split completed
	verdictStalled                    // the rest are quarantined
)

// judgeTerminal is the pure terminal rule, judged on a listing of the
// split records (never the watch-fed view or the planned count alone: a
// subset that happens to be complete must never report success). listed
// is the readable records of splits in play, damaged the number of listed
// splits out of play (a record that cannot be read, damage.go). The plan
// must be final, the listing must hold at least the planned count and
// every split the view knows of (a record the view holds but the listing
// lacks was deleted: no verdict), every child a listed record names (a
// runtime division's residual, divide.go) must be listed or damaged
// itself (the leader may not have created it yet), and every listed split
// must be completed (AllComplete) or completed, quarantined or damaged
// with at least one that is not completed (Stalled). damagedIDs names the
// damaged splits.
func judgeTerminal(final bool, planned uint64, known int, listed []*progressRecord, damagedIDs []string) (v verdict, completed, quarantined int) {
	damaged := len(damagedIDs)
	ids := make(map[string]bool, len(listed)+damaged)
	for _, r := range listed {
		ids[r.ID] = true
	}
	for _, id := range damagedIDs {
		ids[id] = true
	}
	unborn := false
	for _, r := range listed {
		for _, c := range r.Children {
			unborn = unborn || !ids[c.ID]
		}
		switch r.Status {
		case statusCompleted:
			completed++
		case statusQuarant:
			quarantined++
		}
	}
	n := len(listed) + damaged
	switch {
	case !final || uint64(n) < planned || n < known || unborn:
		return verdictNone, completed, quarantined
	case completed == n:
		return verdictAllComplete, completed, quarantined
	case completed+quarantined+damaged == n:
		return verdictStalled, completed, quarantined
	}
	return verdictNone, completed, quarantined
}

// detectTerminal latches AllComplete or Stalled. When the view says the
// job may be over, it lists the split records beside the loop and judges
// the listing.
func (a *actor) detectTerminal() {
	if !a.w.fullView {
		return // a scoped worker reads the leader's verdict instead
	}
	if a.verdicts.terminal || a.verdicts.listing || a.planning.plan == nil || a.planning.plan.Finality != finalityFinal {
		return
	}
	// Splits out of play (damage.go) count toward the planned total, and a
	// damaged spec leaves a runnable record that nobody can claim.
	known, stuck := a.job.knownSplits(a.records.damagedSplits())
	if uint64(known) < a.planning.plan.Planned || a.job.nCompleted+a.job.nQuarant+stuck != a.job.nSplits {
		return
	}
	if a.verdicts.listedAt != 0 && a.verdicts.listedAt == a.job.durableSeq {
		return // nothing changed since the last authoritative check
	}
	a.verdicts.listing = true
	a.verdicts.listedAt = a.job.durableSeq
	since := a.job.mark()
	a.spawn(func(ctx context.Context) func() error {
		entries, err := a.st.List(ctx, Durable, prefixSplit)
		return func() error {
			a.verdicts.listing = false
			if err != nil {
				a.log.Debug("terminal check deferred: listing failed", "err", err)
				a.verdicts.listedAt = 0
				a.failed(opKey{op: "terminal"})
				return nil
			}
			listed := make([]*progressRecord, 0, len(entries))
			var damaged []string
			for _, e := range entries {
				id := e.Key[len(prefixSplit):]
				r, err := decodeProgress(e.Key, id, e.Value, a.fpHash)
				if ok, err := a.readable(id, e.Key, e.Revision, err); err != nil {
					return err
				} else if !ok {
					damaged = append(damaged, id)
					continue
				}
				a.upsert(id, r, e.Revision, readSince(since))
				if a.records.splitDamaged(id) && r.Status == statusRunnable {
					damaged = append(damaged, id) // its spec is unreadable: nobody can claim it
					continue
				}
				listed = append(listed, r)
			}
			a.verdicts.listedAt = a.job.durableSeq
			if a.verdicts.terminal {
				return nil
			}
			known, _ := a.job.knownSplits(a.records.damagedSplits())
			v, completed, quarantined := judgeTerminal(a.planning.plan.Finality == finalityFinal, a.planning.plan.Planned, known, listed, damaged)
			switch v {
			case verdictAllComplete:
				a.verdicts.terminal = true
				a.verdicts.judged = &verdictVal{Schema: SchemaVersion, FP: a.fpHash, Verdict: verdictKeyComplete, Completed: uint64(completed)}
				a.log.Info("job complete: every split is completed", "splits", len(listed))
				a.c.emit(AllComplete{})
			case verdictStalled:
				a.verdicts.terminal, a.verdicts.stalled = true, true
				a.verdicts.judged = &verdictVal{Schema: SchemaVersion, FP: a.fpHash, Verdict: verdictKeyStalled,
					Completed: uint64(completed), Quarantined: uint64(quarantined), Damaged: damaged}
				if len(damaged) > 0 {
					a.log.Error("job stalled: the remaining splits are quarantined or have unreadable records",
						"completed", completed, "quarantined", quarantined, "damaged", damaged, "keys", a.records.damagedKeys())
				} else {
					a.log.Warn("job stalled: the remaining splits are quarantined", "completed", completed, "quarantined", quarantined)
				}
				a.c.emit(Stalled{Completed: uint64(completed), Quarantined: uint64(quarantined), Damaged: damaged})
			}
			return nil
		}
	})
}

// knownSplits is the number of splits the view knows of, counting those
// whose progress record is unreadable, and of those whose readable record
// is runnable but whose spec is unreadable (nobody can claim them).
func (j *jobView) knownSplits(damaged []string) (known, stuck int) {
	known = j.nSplits
	for _, id := range damaged {
		switch v := j.splits[id]; {
		case v == nil || v.prog == nil:
			known++
		case v.prog.Status == statusRunnable:
			stuck++
		}
	}
	return known, stuck
}

// withdrawStall lifts a latched Stalled verdict when a quarantined split
// is made runnable again (an operator's requeue): the worker takes part
// again, so the split is assigned and claimed without a restart. A later
// verdict is judged afresh. AllComplete is never withdrawn. It reports
// whether a verdict was withdrawn.
func (v *verdictState) withdrawStall() bool {
	if !v.terminal || !v.stalled {
		return false
	}
	v.terminal, v.stalled = false, false
	v.listedAt = 0
	v.judged = nil
	return true
}

// ----- the verdict record ----------------------------------------------------------

// A worker that watches only its own keys (watchscope.go) cannot count the
// job's completions, so on a store with [KeyWatcher] the leader, which
// watches the whole job, writes the verdict it latched to the durable
// "verdict" key, and deletes it when a requeue withdraws a stall; scoped
// workers latch (and withdraw) what it says. A leader that stops before
// its write lands leaves the verdict to its successor, which judges the
// job afresh from its own listing.

const (
	verdictKeyComplete = "complete"
	verdictKeyStalled  = "stalled"
)

// verdictVal is the durable "verdict" record.
type verdictVal struct {
	Schema      int      `json:"schema"`
	FP          uint64   `json:"fp"`
	Verdict     string   `json:"verdict"`
	Completed   uint64   `json:"completed"`
	Quarantined uint64   `json:"quarantined"`
	Damaged     []string `json:"damaged,omitempty"`
}

func decodeVerdict(data []byte, fp uint64) (*verdictVal, error) {
	var r verdictVal
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, recordError(Durable, keyVerdict, err)
	}
	if r.Verdict != verdictKeyComplete && r.Verdict != verdictKeyStalled {
		return nil, recordError(Durable, keyVerdict, fmt.Errorf("verdict %q", r.Verdict))
	}
	if r.FP != fp {
		return nil, Fatalf("record %q has fingerprint hash %d, this job's is %d: two jobs share a namespace: %w", keyVerdict, r.FP, fp, ErrUnreadableRecord)
	}
	return &r, nil
}

// onVerdict folds the verdict record (nil: there is none). Only a scoped
// worker acts on it; a worker with the whole job in view judges it itself.
func (a *actor) onVerdict(v *verdictVal) {
	a.verdicts.record, a.verdicts.recordAt = v, a.job.clock
	if a.wantWholeJob() {
		return
	}
	switch {
	case v == nil:
		if a.verdicts.terminal && a.verdicts.stalled {
			a.verdicts.terminal, a.verdicts.stalled = false, false
			a.dirty, a.worker.ownDirty = true, true
			a.log.Info("stall withdrawn: the leader found a quarantined split runnable again")
		}
	case v.Verdict == verdictKeyComplete:
		if !a.verdicts.terminal || a.verdicts.stalled {
			a.verdicts.terminal, a.verdicts.stalled = true, false
			a.log.Info("job complete: the leader found every split completed", "splits", v.Completed)
			a.planFinalized(v.Completed)
			a.c.emit(AllComplete{})
		}
	case !a.verdicts.terminal:
		a.verdicts.terminal, a.verdicts.stalled = true, true
		if len(v.Damaged) > 0 {
			a.log.Error("job stalled: the leader found the remaining splits quarantined or with unreadable records",
				"completed", v.Completed, "quarantined", v.Quarantined, "damaged", v.Damaged)
		} else {
			a.log.Warn("job stalled: the leader found the remaining splits quarantined", "completed", v.Completed, "quarantined", v.Quarantined)
		}
		a.planFinalized(v.Completed + v.Quarantined + uint64(len(v.Damaged)))
		a.c.emit(Stalled{Completed: v.Completed, Quarantined: v.Quarantined, Damaged: slices.Clone(v.Damaged)})
	}
}

// syncVerdict, on a leader with the whole job in view, makes the verdict
// record say what it latched: written when a verdict latches, deleted when
// a stall is withdrawn. A failed write is retried with backoff.
func (a *actor) syncVerdict(now time.Time) {
	if a.kw == nil || a.leader.term == nil || !a.w.fullView || a.verdicts.syncing {
		return
	}
	// Compared with the record as the view holds it, not with what this
	// leader last wrote: a record left by an earlier run (a stall since
	// requeued while no worker ran) is corrected too.
	var want, have []byte
	if a.verdicts.judged != nil {
		want = encode(a.verdicts.judged)
	}
	if a.verdicts.record != nil {
		have = encode(a.verdicts.record)
	}
	if bytes.Equal(want, have) || !a.io.due(opKey{op: "verdict"}, now) {
		return
	}
	judged := a.verdicts.judged
	a.verdicts.syncing = true
	a.spawn(func(ctx context.Context) func() error {
		err := writeVerdict(ctx, a.st, want)
		return func() error {
			a.verdicts.syncing = false
			if err != nil {
				if a.closing() {
					// The coordinator is closing: the write was cancelled,
					// and a successor leader judges the job afresh.
					a.log.Debug("verdict record not written: the coordinator is closing", "err", err)
					return nil
				}
				a.log.Warn("writing the verdict record failed; retrying", "err", err)
				a.failed(opKey{op: "verdict"})
				return nil
			}
			a.verdicts.record = judged // the watch brings the same at its revision
			return nil
		}
	})
}

// recordVerdict, on Close, after the actor exited, writes the verdict this
// worker latched as the leader if the record does not hold it yet. A
// pipeline ends on AllComplete and closes its coordinator at once, and
// Close cancels the I/O in flight: without this, the leader's write was
// cut off nearly every time, and each scoped peer learnt that the job had
// ended only when it became the leader itself, one succession after
// another, seconds late (docs/decisions/020). A stall is recorded only by
// a worker that still led when its loop stopped: a requeue its successor
// saw may have withdrawn it. AllComplete is never withdrawn. Bounded by
// ctx (Close's direct-release budget); a failure is logged, and a
// successor judges the job afresh.
func (c *StoreCoordinator) recordVerdict(ctx context.Context) {
	a := c.act
	v := a.verdicts.judged
	if a.kw == nil || v == nil || v.Verdict != verdictKeyComplete && a.leader.term == nil {
		return
	}
	want := encode(v)
	if a.verdicts.record != nil && bytes.Equal(encode(a.verdicts.record), want) {
		return
	}
	if err := writeVerdict(ctx, c.store, want); err != nil {
		c.log.Warn("the verdict record was not written before this worker left; the next leader judges the job afresh",
			"verdict", v.Verdict, "err", err)
		return
	}
	a.verdicts.record = v
	c.log.Debug("verdict recorded on close", "verdict", v.Verdict)
}

// writeVerdict makes the verdict record hold want (nil: deletes it).
func writeVerdict(ctx context.Context, st Store, want []byte) error {
	if want == nil {
		_, err := st.Delete(ctx, Durable, keyVerdict, AnyRevision)
		return err
	}
	for range 3 {
		e, ok, err := st.Get(ctx, Durable, keyVerdict)
		if err != nil {
			return err
		}
		var o Outcome
		switch {
		case !ok:
			o, err = st.Create(ctx, Durable, keyVerdict, want)
		case bytes.Equal(e.Value, want):
			return nil
		default:
			o, err = st.Update(ctx, Durable, keyVerdict, want, e.Revision)
		}
		if err != nil || o.Won {
			return err
		}
	}
	return Retryablef("the verdict record kept changing under the write")
}

// verdictPut folds a put of the verdict record at rev.
func (a *actor) verdictPut(value []byte, rev uint64) error {
	if rev <= a.verdicts.recordRev {
		return nil
	}
	v, err := decodeVerdict(value, a.fpHash)
	if err != nil {
		return err
	}
	a.verdicts.recordRev = rev
	a.onVerdict(v)
	return nil
}

// verdictDelete folds a delete of the verdict record at rev (0: revision
// unknown).
func (a *actor) verdictDelete(rev uint64) {
	if rev == 0 || rev > a.verdicts.recordRev {
		a.verdicts.recordRev = max(a.verdicts.recordRev, rev)
		a.onVerdict(nil)
	}
}
