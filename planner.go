package spate

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// SplitPlanner is the source-provided work enumerator. It runs only on the
// fleet's elected leader: at job start, once per new leader, and again every
// replan interval while the plan is [PlanOpen].
//
// Every worker presents an equivalent planner to [SplitCoordinator.Start];
// whichever instance holds leadership uses its own copy. Plan may block on
// I/O (an object-store LIST, an index query); the coordinator calls it off
// its own goroutine and cancels ctx when leadership is lost or the
// coordinator closes.
type SplitPlanner interface {
	// Fingerprint is the job's identity, derived from configuration and never
	// from the enumeration. Every worker joining a job must present a
	// byte-equal fingerprint or be rejected Fatal, so that divergent
	// configurations cannot read the same split table two ways. It must not
	// be empty.
	Fingerprint() string

	// Plan enumerates the current work. Unchanged work must yield the same
	// split ids, so that re-emitting already planned splits is a no-op.
	// Return a Retryable error to have the run retried on the next replan
	// tick; any other error is Fatal.
	Plan(ctx context.Context, pc PlanContext) (SplitPlan, error)
}

// PlanTrigger is an optional interface of a [SplitPlanner] whose input
// can tell that it changed (a new file in a followed directory). The
// coordinator calls PlanTriggers once, with a context that ends when the
// coordinator closes. While this worker leads an open plan, a value on the
// channel has the planner run at once (one run at a time: values that
// arrive meanwhile make one more run), besides every replan interval. The
// planner should send sparingly: each value is a planner run.
type PlanTrigger interface {
	PlanTriggers(ctx context.Context) <-chan struct{}
}

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
	pruned  int
	// pruneErr is why a prune failed (the run went on).
	pruneErr error
}

// planning is the actor's planner runs: at most one at a time, beside the
// loop; its result arrives through the loop's select.
type planning struct {
	due     bool               // a run is due: startPlan starts it
	running bool               // a run is in flight
	cancel  context.CancelFunc // cancels the run in flight (leadership lost, close)
	done    chan planResult    // the run's result, into the loop

	// plan is the plan record as this worker last saw it (nil: not yet),
	// at revision planRev, set at loop clock planAt; finalSent: the
	// PlanFinalized event was emitted. Only the plan record's events
	// (planPut, planAbsent) and setPlan write them.
	plan      *planRecord
	planRev   uint64
	planAt    uint64
	finalSent bool
}

// joined holds the plan record that joining the job read or created, at
// rev (startup, before the watches fold anything).
func (p *planning) joined(plan *planRecord, rev uint64) { p.plan, p.planRev = plan, rev }

// elected makes a run due for a new leader. Decision: a final plan is
// never re-run. Final means the enumeration is complete (and its publish
// proves the seeding finished); re-running it could only add splits a
// final plan must not grow by (a file rewritten since, say).
func (p *planning) elected() { p.due = p.plan.Finality != finalityFinal }

// stop ends the leader's planning: no run is due, and the one in flight
// is cancelled.
func (p *planning) stop() {
	p.due = false
	if p.cancel != nil {
		p.cancel()
	}
}

// replanOpen makes a run due on the leader while the plan is open (the
// replan interval or a plan trigger fired).
func (a *actor) replanOpen() {
	if a.leader.term != nil && a.planning.plan != nil && a.planning.plan.Finality == finalityOpen {
		a.planning.due = true
	}
}

// planPut folds a put of the plan record at rev.
func (a *actor) planPut(key string, value []byte, rev uint64) error {
	if rev <= a.planning.planRev {
		return nil
	}
	p, err := decodePlan(key, value, a.fp)
	if err != nil {
		return err
	}
	a.setPlan(p, rev)
	return nil
}

// planAbsent applies the plan record's absence from a listing of the
// whole durable keyspace (of n records) that started at mark: a plan seen
// before it that the listing lacks means the job's records are gone.
func (a *actor) planAbsent(mark uint64, n int) error {
	if a.planning.plan != nil && a.planning.planAt < mark {
		return errNamespaceGone(fmt.Sprintf("a listing of the durable keyspace (%d records) has no plan record", n))
	}
	return nil
}

// planFinalized emits PlanFinalized, once: on reading the final plan, or
// on a terminal verdict read before the plan (a scoped worker's watch of
// the verdict record may deliver it first; a verdict implies a final plan).
func (a *actor) planFinalized(planned uint64) {
	if !a.planning.finalSent {
		a.planning.finalSent = true
		a.c.emit(PlanFinalized{Planned: planned})
	}
}

func (a *actor) setPlan(p *planRecord, rev uint64) {
	if rev <= a.planning.planRev {
		return
	}
	a.planning.plan, a.planning.planRev, a.planning.planAt = p, rev, a.job.clock
	a.job.durableChanged()
	if p.Finality == finalityFinal {
		a.planFinalized(p.Planned)
	}
	if a.leader.term != nil && p.Generation > a.leader.term.generation {
		a.demote(fmt.Sprintf("a successor bumped the plan generation to %d", p.Generation))
	}
}

// wait lets a planner run that ignores its cancelled context finish on
// its own: Close waits for it at most timeout.
func (p *planning) wait(timeout time.Duration, log *slog.Logger) {
	if !p.running {
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		log.Warn("the planner did not return within the op timeout of its cancellation; leaving it behind", "timeout", timeout)
	}
}

// planSeedConcurrency bounds the seeding writes in flight. The workers
// place splits only as fast as they are seeded: at 8, 100 workers on one
// embedded etcd waited 33-37 s for 10,000 splits, each worker claiming
// its last 30 one by one as each publish brought a few more; at 32 all
// were held after 6.6 s.
const planSeedConcurrency = 32

// planRun is what a planner run needs, and nothing of the actor: it runs
// beside the loop.
type planRun struct {
	st      Store
	planner SplitPlanner
	fpHash  uint64
	m       *coordMetrics
	// known are the splits whose records the leader's view holds: a seed
	// of one would be a create-if-absent that loses.
	known map[string]struct{}
	// candidates are the completed splits a prune may delete (prune.go).
	candidates []pruneCandidate
}

// startPlan launches a due planner run off the actor goroutine. Every write
// the run makes is create-if-absent of deterministic ids, or one
// compare-and-swap on the plan revision captured now, so it cannot race the
// actor's decisions.
func (a *actor) startPlan() {
	if !a.planning.due || a.planning.running || a.planning.plan == nil {
		return
	}
	a.planning.due = false
	a.planning.running = true
	snap, rev := *a.planning.plan, a.planning.planRev
	ctx, cancel := context.WithCancel(a.ctx)
	a.planning.cancel = cancel
	// The splits this leader's view already holds are not seeded again:
	// a replan of an open plan writes what is new, not the whole plan.
	known := make(map[string]struct{}, len(a.job.splits))
	for id, sv := range a.job.splits {
		if sv.prog != nil && sv.spec != nil {
			known[id] = struct{}{}
		}
	}
	run := planRun{st: a.st, planner: a.planner, fpHash: a.fpHash, m: a.m, known: known, candidates: a.pruneCandidates()}
	done := a.planning.done
	go func() {
		defer cancel()
		done <- run.run(ctx, snap, rev)
	}()
}

func (p planRun) run(ctx context.Context, snap planRecord, rev uint64) (res planResult) {
	start := time.Now()
	defer func() { p.m.replanDur.Observe(time.Since(start).Seconds()) }()
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
		plan, err = p.planner.Plan(ctx, PlanContext{PlannerState: cursor, Generation: snap.Generation})
		return err
	}()
	if err != nil {
		if ctx.Err() != nil || kindOf(err) == kindRetryable {
			return planResult{outcome: planError, err: err}
		}
		return planResult{outcome: planFatal, err: fmt.Errorf("planner: %w", err)}
	}
	for _, s := range plan.Splits {
		if s.Spec.ID.IsZero() {
			return planResult{outcome: planFatal, err: Fatalf("planner returned a split with a zero SplitID")}
		}
	}
	created, tried, err := p.seed(ctx, plan.Splits, snap.Generation)
	if err != nil {
		if kindOf(err) == kindFatal {
			return planResult{outcome: planFatal, err: err}
		}
		return planResult{outcome: planError, err: err, created: created}
	}
	// An open plan's completed splits whose work is gone are pruned
	// (prune.go); never under a final plan, whose count terminal
	// detection judges.
	// A failed prune costs store space, not the plan: the run goes on,
	// and the next one offers the splits again.
	pruned, pruneErr := 0, error(nil)
	if plan.Finality != PlanFinal && snap.Finality != finalityFinal {
		planned := make(map[string]bool, len(plan.Splits))
		for _, s := range plan.Splits {
			planned[s.Spec.ID.id] = true
		}
		pruned, pruneErr = p.prune(ctx, planned)
	}
	// Recount from a listing, never locally: a crash or a failed publish
	// between seeding and publishing would otherwise desynchronise terminal
	// detection for good. A run that had nothing to seed, under a plan
	// whose count the view agrees with, has nothing to recount: an open
	// plan's replans then cost what changed, not a listing of the job.
	// (A run that seeded still lists: the view may lag the store, and a
	// count below the records' could let terminal detection fire before
	// a record the view has not seen yet.)
	next := snap
	if tried > 0 || pruned > 0 || uint64(len(p.known)) != snap.Planned {
		entries, err := p.st.List(ctx, Durable, prefixSplit)
		if err != nil {
			return planResult{outcome: planError, err: err, created: created}
		}
		next.Planned = uint64(len(entries))
	}
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
	o, err := p.st.Update(ctx, Durable, keyPlan, encode(&next), rev)
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
	return planResult{outcome: out, plan: &next, rev: o.Revision, created: created, pruned: pruned, pruneErr: pruneErr}
}

// seed writes each planned split the view does not hold, spec first then
// progress, both create-if-absent: a seed never overwrites an existing
// record. It returns the splits it created and the splits it tried.
func (p planRun) seed(ctx context.Context, splits []PlannedSplit, gen uint64) (created, tried int, err error) {
	var won atomic.Int64
	var firstErr error
	var mu sync.Mutex
	setErr := func(err error) {
		mu.Lock()
		if firstErr == nil || kindOf(err) == kindFatal && kindOf(firstErr) != kindFatal {
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
		if _, ok := p.known[id]; ok {
			continue // seeded before: its records exist
		}
		tried++
		spec := encode(&specRecord{Schema: SchemaVersion, ID: id, FP: p.fpHash, Generation: gen,
			Weight: s.Spec.effectiveWeight(), Descriptor: nonNil(s.Spec.Descriptor)})
		prog := encode(newProgressRecord(id, p.fpHash, s.Seed))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if ctx.Err() != nil {
				return
			}
			if _, err := p.st.Create(ctx, Durable, prefixSpec+id, spec); err != nil {
				setErr(fmt.Errorf("seeding spec %s: %w", id, err))
				return
			}
			o, err := p.st.Create(ctx, Durable, prefixSplit+id, prog)
			if err != nil {
				setErr(fmt.Errorf("seeding split %s: %w", id, err))
				return
			}
			if o.Won {
				won.Add(1)
				p.m.planned.Inc()
			}
		})
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = Retryablef("planning cancelled: %w", ctx.Err())
	}
	return int(won.Load()), tried, firstErr
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (a *actor) finishPlan(res planResult) error {
	a.planning.running = false
	a.planning.cancel = nil
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
		wasFinal := a.planning.plan != nil && a.planning.plan.Finality == finalityFinal
		a.setPlan(res.plan, res.rev)
		if res.pruned > 0 {
			a.log.Info("pruned completed splits whose work is gone", "pruned", res.pruned, "planned", res.plan.Planned)
		}
		if res.pruneErr != nil {
			a.log.Warn("pruning completed splits failed; the next planner run retries", "pruned", res.pruned, "err", res.pruneErr)
		}
		if !wasFinal && res.plan.Finality == finalityFinal {
			a.log.Info("plan is final", "planned", res.plan.Planned)
		}
		a.dirty = true
	}
	return nil
}
