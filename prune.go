package spate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Pruning: an open plan's completed splits whose work is gone for good
// (a followed file that was deleted) are deleted from the store, so that
// a job that runs for a year holds what is live plus a retention window,
// not every split it ever planned (decision 040).
//
// The leader prunes at the end of a planner run, beside the loop. A split
// is a candidate when its record says completed, the run did not plan it,
// it is no divided split's parent or child, and the plan stays open; the
// planner (a [SplitPruner]) chooses among the candidates those whose work
// no longer exists and whose completion is older than its retention. Each
// is deleted in two store calls, each on one key and guarded by the
// revision the leader saw: its spec first, then its progress record. So:
//
//   - a crash between the two leaves a completed record without a spec,
//     which the next run deletes without asking (only a prune deletes a
//     spec);
//   - a record that changed since it was seen is not deleted;
//   - every view reads a completed split whose spec is gone and whose
//     record then goes as pruned, and forgets it: the leader does not
//     restore it as it restores a record deleted from outside;
//   - a pruned split is never seeded again unless its planner plans it
//     again, which a SplitPruner promises not to do for work that is gone.

// SplitPruner is an optional interface of a [SplitPlanner] whose open
// plan loses work for good: a followed file that was deleted, an object
// removed from a followed bucket. After each run of an open plan the
// leader offers it the completed splits the run did not plan; those it
// returns are deleted from the store (spec and progress record).
//
// Prune must return only splits whose work is gone and will never be
// planned again: a split it returns and a later run plans is new work,
// read from its start. It should keep a completed split for a retention
// window (to inspect, and to keep what a slow listing missed). An error
// prunes nothing; the next run offers the splits again.
type SplitPruner interface {
	Prune(ctx context.Context, done []DoneSplit) ([]SplitID, error)
}

// DoneSplit is a completed split the plan no longer holds, as the leader
// offers it to [SplitPruner.Prune].
type DoneSplit struct {
	// Spec is the split as planned: id, descriptor and weight.
	Spec SplitSpec
	// Progress is its last committed progress (Completed is true).
	Progress SplitProgress
	// CompletedAt is when its completing commit was written (its writer's
	// clock).
	CompletedAt time.Time
}

// pruneCandidate is a split a run may prune, as the leader's view held it
// when the run started.
type pruneCandidate struct {
	done    DoneSplit
	specRev uint64 // 0: its spec is gone (a prune that did not finish)
	progRev uint64
}

// pruneCandidates is the completed splits of the view that a prune may
// delete: completed, readable, no divided split's parent or child, no
// I/O in flight. Nil when the planner does not prune or the plan is
// final.
func (a *actor) pruneCandidates() []pruneCandidate {
	if _, ok := a.planner.(SplitPruner); !ok || a.planning.plan == nil || a.planning.plan.Finality == finalityFinal {
		return nil
	}
	family := map[string]bool{}
	for id, v := range a.job.splits {
		if v.prog != nil && len(v.prog.Children) > 0 {
			family[id] = true
			for _, c := range v.prog.Children {
				family[c.ID] = true
			}
		}
	}
	var out []pruneCandidate
	for id, v := range a.job.splits {
		p := v.prog
		if p == nil || p.Status != statusCompleted || family[id] || a.io.busy[id] || a.records.splitDamaged(id) {
			continue
		}
		c := pruneCandidate{progRev: v.progRev, done: DoneSplit{Spec: SplitSpec{ID: SplitID{id: id}}, CompletedAt: time.UnixMilli(p.WrittenAtMs)}}
		if pr := p.progress(); pr != nil {
			c.done.Progress = *pr
		}
		c.done.Progress.Completed = true
		if v.spec != nil {
			c.specRev = 1 // the view keeps no spec revision: pruneOne reads it
			c.done.Spec.Descriptor, c.done.Spec.Weight = v.own()
		}
		out = append(out, c)
	}
	return out
}

// prune deletes the candidates the planner chooses among those this run
// did not plan (see the top of this file). It returns how many it
// deleted, and the first error (the next run offers the rest again).
func (p planRun) prune(ctx context.Context, planned map[string]bool) (int, error) {
	pruner, ok := p.planner.(SplitPruner)
	if !ok || len(p.candidates) == 0 {
		return 0, nil
	}
	var offer []DoneSplit
	var doomed []pruneCandidate
	byID := map[string]pruneCandidate{}
	for _, c := range p.candidates {
		switch {
		case planned[c.done.Spec.ID.id]:
		case c.specRev == 0:
			doomed = append(doomed, c) // a prune that did not finish
		default:
			offer = append(offer, c.done)
			byID[c.done.Spec.ID.id] = c
		}
	}
	if len(offer) > 0 {
		ids, err := pruner.Prune(ctx, offer)
		if err != nil {
			return 0, fmt.Errorf("the planner's Prune: %w", err)
		}
		for _, id := range ids {
			if c, ok := byID[id.id]; ok {
				doomed = append(doomed, c)
				delete(byID, id.id) // once
			}
		}
	}
	if len(doomed) == 0 {
		return 0, nil
	}
	var pruned atomic.Int64
	var firstErr error
	var mu sync.Mutex
	sem := make(chan struct{}, planSeedConcurrency)
	var wg sync.WaitGroup
	for _, c := range doomed {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ok, err := p.pruneOne(ctx, c)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			if ok {
				pruned.Add(1)
				p.m.pruned.Inc()
			}
		})
	}
	wg.Wait()
	return int(pruned.Load()), firstErr
}

// pruneOne deletes one split's spec, then its progress record at the
// revision the view saw completed. A candidate offered without a spec (a
// prune that did not finish) is left alone if the store has its spec: the
// view had not seen it. A progress record that changed since it was seen,
// or is gone, is left as it is.
func (p planRun) pruneOne(ctx context.Context, c pruneCandidate) (bool, error) {
	id := c.done.Spec.ID.id
	e, ok, err := p.st.Get(ctx, Durable, prefixSpec+id)
	if err != nil {
		return false, fmt.Errorf("pruning split %s: reading its spec: %w", id, err)
	}
	switch {
	case ok && c.specRev == 0:
		return false, nil
	case ok:
		if _, err := p.st.Delete(ctx, Durable, prefixSpec+id, e.Revision); err != nil {
			return false, fmt.Errorf("pruning split %s: deleting its spec: %w", id, err)
		}
	}
	o, err := p.st.Delete(ctx, Durable, prefixSplit+id, c.progRev)
	if err != nil {
		return false, fmt.Errorf("pruning split %s: deleting its progress record: %w", id, err)
	}
	return o.Won, nil
}

// pruned reports whether a split's progress record that is gone from the
// store was pruned: its last state is completed and its spec is gone
// too. The view then forgets the split instead of restoring the record.
func pruned(last *progressRecord, specGone bool) bool {
	return last != nil && last.Status == statusCompleted && specGone
}

// forgetPruned drops a pruned split from the view; its entry stays only
// while a lease of it is live. (A read that started before the prune and
// lists its records again brings the split back until the next listing,
// which finds both records gone and forgets it again: never a restore.)
func (a *actor) forgetPruned(id string, rev uint64) {
	if !a.job.dropPruned(id, rev) {
		return
	}
	a.worker.touch(id)
	a.records.found(id)
	a.dirty = true
	a.log.Debug("a completed split whose work is gone was pruned from the store", "split", id)
}
