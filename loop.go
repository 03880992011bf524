package spate

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// actor owns one coordinator's local view of the job and every decision
// made on it. It never waits on the store: every store call runs on a
// goroutine beside it (spawn, splitIO) and hands its result back as a
// continuation that runs on the loop, and the leases are kept alive by the
// renewer on its own schedule. So no commit, listing, watch
// re-establishment or planning run can delay a renewal, and commits on
// different splits run concurrently (at most one write in flight per
// split, each fenced on the revision the view last saw).
type actor struct {
	env     // the store, this worker's identity, metrics and log: never change (env.go)
	c       *StoreCoordinator
	cfg     Config
	planner SplitPlanner
	ctx     context.Context

	job      jobView       // the view of the job (view.go)
	members  membership    // the fleet: presence, budgets, departed members (members.go)
	assigns  assignRecords // the assignment records (publish.go)
	division division      // divided splits awaiting their children (divide.go)
	records  recordState   // records deleted or unreadable (damage.go)
	worker   worker        // this worker's splits, claims and assignment (tenancy.go)
	leader   leaderState   // leadership, elections and publishing (leader.go)
	verdicts verdictState  // the job's terminal verdict (terminal.go)
	planning planning      // planner runs (planner.go)
	w        watchSet      // the watches (watch.go) and scoped watching (watchscope.go)
	// dirty: an input of the leader's step changed (the assignment, the
	// terminal check): step looks again.
	dirty bool

	wake wakeTimer // steps the loop when something falls due
	io   loopIO    // the store calls beside the loop
}

// loopIO is the store calls the loop runs beside itself (spawn, splitIO):
// their continuations come back through results; one split's writes run
// one at a time and in order (busy, later), and an operation that failed
// backs off (retry).
type loopIO struct {
	wg         sync.WaitGroup
	results    *signalQueue[func() error]
	busy       map[string]bool           // splits with a write of the loop's in flight
	fenceCells                           // held splits' commit fences (commit.go)
	later      map[string][]func() error // work waiting for a busy split
	stopping   bool                      // the loop has exited: no new I/O
	retry      map[opKey]time.Time       // failed operations: not before then
}

func newActor(c *StoreCoordinator, planner SplitPlanner, fp string) *actor {
	a := &actor{
		env: newEnv(c, fp), c: c, cfg: c.cfg, planner: planner,
		job:      jobView{splits: map[string]*splitView{}},
		division: division{parents: map[string]bool{}},
		assigns:  assignRecords{byInst: map[string]assignEntry{}},
		members:  newMembership(),
		worker:   newWorker(c.m, c.log),
		leader:   leaderState{pub: publishState{pinnedSince: map[string]time.Time{}, landedAt: map[string]time.Time{}, moving: map[string]bool{}}},
		records:  recordState{missing: map[string]*progressRecord{}, damaged: map[string]*damagedRecord{}},
		planning: planning{done: make(chan planResult, 1)},
		io: loopIO{busy: map[string]bool{}, fenceCells: fenceCells{cells: map[string]*fenceCell{}, shared: &c.cells}, later: map[string][]func() error{},
			results: newSignalQueue[func() error](), retry: map[opKey]time.Time{}},
	}
	a.w = newWatchSet(c.tm.rewatchJitter, a.kw != nil)
	return a
}

// stepBatch bounds the events served between two steps.
const stepBatch = 64

// run is the coordinator's goroutine: the startup phases, then the loop,
// then shutdown.
func (a *actor) run(ctx context.Context) {
	a.ctx = ctx
	defer a.w.rewatch.Stop()
	a.wake.start()
	defer a.wake.stop()
	// The renewer starts before the startup phases so that it is there for
	// the presence written by announce; it has nothing to renew before.
	renewCtx, stopRenew := context.WithCancel(ctx)
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		a.renew.run(renewCtx)
	}()
	defer a.shutdown(stopRenew, renewDone)
	if err := a.startup(ctx); err != nil {
		if ctx.Err() == nil {
			a.log.Error("coordinator failed to start", "err", err)
			a.c.fail(err)
		}
		return
	}
	if err := a.step(); err != nil {
		a.die(err)
		return
	}
	a.loop(ctx)
}

// shutdown ends what run started, in order: the watches, planning and the
// renewer, then the fence cells and the I/O in flight (whose results are
// folded, so Close knows of a claim that landed as the loop stopped).
func (a *actor) shutdown(stopRenew context.CancelFunc, renewDone <-chan struct{}) {
	for _, w := range a.w.streams {
		if w.cancel != nil {
			w.cancel()
		}
	}
	a.w.closeGroups()
	if a.planning.cancel != nil {
		a.planning.cancel()
	}
	stopRenew()
	<-renewDone
	a.closeCells()
	a.io.stop()
	a.planning.wait(a.cfg.OpTimeout, a.log)
	a.m.leader.Set(0)
	a.m.splitsOwned.Set(0)
}

// loop serves the loop's inputs until ctx ends or a step fails: each
// wake-up serves one input, then what else is ready (serveReady), then
// steps once.
func (a *actor) loop(ctx context.Context) {
	tick := time.NewTicker(a.c.tm.tick)
	defer tick.Stop()
	// The listing backstop runs every ReconcileInterval, jittered by a
	// quarter either way so that a fleet started together does not list
	// the store together.
	reconcile := time.NewTimer(jittered(a.cfg.ReconcileInterval))
	defer reconcile.Stop()
	replan := time.NewTicker(a.cfg.ReplanInterval)
	defer replan.Stop()
	var planTriggers <-chan struct{} // the planner's own: its input changed
	if pt, ok := a.planner.(PlanTrigger); ok {
		planTriggers = pt.PlanTriggers(ctx)
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case cmd := <-a.c.cmds:
			err = a.onCommand(cmd)
		case <-a.io.results.sig:
			err = a.onResults()
		case <-a.renew.notes.sig:
			a.worker.ownDirty = true
			err = a.onRenewNotes(a.renew.notes.take())
		case ev, ok := <-a.w.streams[0].ch:
			err = a.onWatch(a.w.streams[0], ev, ok)
		case ev, ok := <-a.w.streams[1].ch:
			err = a.onWatch(a.w.streams[1], ev, ok)
		case ke := <-a.w.keyEvents:
			err = a.onKeyEvent(ke)
		case <-a.w.rewatch.C:
			a.reestablish()
		case <-tick.C:
			a.worker.ownDirty = true // the backstop for a change no flag caught
			a.w.expireSnapshots(time.Now(), a.log, a.c.tm.snapshotBudget)
		case <-a.wake.c():
			a.worker.ownDirty = true // a retry fell due
			a.wake.fired()
		case <-reconcile.C:
			reconcile.Reset(jittered(a.cfg.ReconcileInterval))
			if a.wantWholeJob() {
				a.reconcile()
			} else {
				a.w.refreshScope()
			}
		case <-replan.C:
			a.replanOpen()
		case <-planTriggers:
			a.replanOpen()
		case res := <-a.planning.done:
			err = a.finishPlan(res)
		}
		// Serve what else is ready before deciding: a step is O(assigned)
		// and need not run once per commit. Nothing on the loop blocks,
		// so a batch is short.
		for i := 0; i < stepBatch && err == nil; i++ {
			var served bool
			if served, err = a.serveReady(); !served {
				break
			}
		}
		if err == nil {
			err = a.step()
		}
		if err != nil {
			a.die(err)
			return
		}
	}
}

// jittered returns d scaled by a random factor in [0.75, 1.25).
func jittered(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

func (a *actor) die(err error) {
	if a.ctx.Err() != nil {
		return
	}
	a.log.Error("coordinator stopped on a fatal error", "err", err)
	a.c.fail(err)
}

// step runs after every event, in this order: rebalance-delay windows,
// membership logs, then (unless a terminal verdict latched or the worker is
// parting) election, assignment publishing, reconciliation toward the own
// assignment, revocation deadlines, and terminal detection.
func (a *actor) step() error {
	now := time.Now()
	if expireDeparted(a.members.departed, a.cfg.RebalanceDelay, now) {
		a.dirty = true
	}
	a.members.logMembership(a.log, a.self)
	a.syncVerdict(now)
	// Watches are kept up in every state: a worker that latched Stalled
	// must still see the verdict withdrawn (its listing backstop closes
	// its key groups, and only this reopens them).
	a.syncWatchMode()
	if a.verdicts.terminal {
		a.gauges()
		return nil
	}
	if a.worker.parting {
		a.detectTerminal()
		a.gauges()
		return nil
	}
	if a.leader.key == nil && a.leader.term == nil && a.io.due(opKey{op: "elect"}, now) {
		a.elect(now)
	}
	if a.leader.term != nil && a.w.fullView {
		if a.leader.pub.settleEnded(now) {
			a.dirty = true // a settling split may move again
		}
		a.restoreMissing(now)
		a.createChildren(now)
		a.askDivisions(now)
		a.startPlan()
		if a.dirty && now.Before(a.leader.term.settleUntil) {
			a.wake.arm(a.leader.term.settleUntil)
		}
		if a.dirty && !now.Before(a.leader.term.settleUntil) && a.io.due(opKey{op: "publish"}, now) {
			if now.Before(a.leader.pub.after) {
				a.wake.arm(a.leader.pub.after)
			} else {
				a.publish(now)
			}
		}
	}
	if err := a.reconcileOwn(now); err != nil {
		return err
	}
	a.serveAsks()
	if err := a.serviceRevocations(now); err != nil {
		return err
	}
	if a.io.due(opKey{op: "terminal"}, now) {
		a.detectTerminal()
	}
	a.gauges()
	return nil
}

func (a *actor) gauges() {
	a.m.splitsOwned.Set(float64(len(a.worker.owned)))
	completed, quarantined := a.job.terminalCounts()
	a.m.splitsCompleted.Set(float64(completed))
	a.m.splitsQuarantined.Set(float64(quarantined))
	live := len(a.members.presence)
	if _, ok := a.members.presence[a.self]; !ok && !a.worker.parting {
		live++ // self always counts
	}
	a.m.liveWorkers.Set(float64(live))
	a.m.idle.Set(b2f(len(a.worker.owned) == 0))
	a.m.splitsDraining.Set(float64(len(a.worker.revocations.byID)))
	a.m.leader.Set(b2f(a.leader.term != nil))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// serveReady serves one ready command, I/O result, watch event or key
// event without waiting (the events a batch drains before a step);
// served is false when none is ready.
func (a *actor) serveReady() (served bool, err error) {
	select {
	case cmd := <-a.c.cmds:
		return true, a.onCommand(cmd)
	case <-a.io.results.sig:
		return true, a.onResults()
	case ev, ok := <-a.w.streams[0].ch:
		return true, a.onWatch(a.w.streams[0], ev, ok)
	case ev, ok := <-a.w.streams[1].ch:
		return true, a.onWatch(a.w.streams[1], ev, ok)
	case ke := <-a.w.keyEvents:
		return true, a.onKeyEvent(ke)
	default:
		return false, nil
	}
}

// onCommand takes a command of the handle.
func (a *actor) onCommand(cmd *command) error {
	a.worker.ownDirty = true
	return a.handle(cmd)
}

// onResults runs the continuations of the I/O beside the loop.
func (a *actor) onResults() error {
	a.worker.ownDirty = true
	return a.io.runResults()
}

// ----- I/O beside the loop -------------------------------------------------

// spawn runs io on its own goroutine and the continuation it returns on
// the loop. io must not touch the actor's state; the continuation may.
func (a *actor) spawn(io func(ctx context.Context) func() error) {
	if a.io.stopping {
		return
	}
	a.io.goBeside(func() { a.io.results.put(io(a.ctx)) })
}

// closing reports whether the coordinator is closing: the loop has
// exited or its context is done, so a write that failed was likely
// cancelled by the close.
func (a *actor) closing() bool { return a.io.stopping || a.ctx.Err() != nil }

// goBeside runs f on its own goroutine, which shutdown waits for.
func (l *loopIO) goBeside(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

func (l *loopIO) runResults() error {
	for _, k := range l.results.take() {
		if k == nil {
			continue
		}
		if err := k(); err != nil {
			return err
		}
	}
	return nil
}

// splitIO is spawn for a write on one split: the split is busy until the
// continuation has run, and work queued behind it (onSplit) runs then.
func (a *actor) splitIO(id string, io func(ctx context.Context) func() error) {
	if a.io.stopping {
		return
	}
	a.io.busy[id] = true
	a.spawn(func(ctx context.Context) func() error {
		k := io(ctx)
		return func() error {
			delete(a.io.busy, id)
			if k != nil {
				if err := k(); err != nil {
					a.io.unreserve(id, a.job.splits[id])
					return err
				}
			}
			a.io.unreserve(id, a.job.splits[id])
			return a.next(id)
		}
	})
}

// onSplit runs start now if no write on split id is in flight, or once
// the one in flight has finished. Per-split writes stay ordered, and each
// fences on the revision its predecessor left.
// A held split's fence cell is reserved for the loop meanwhile, so that
// no commit on the caller's goroutine (commit.go) runs beside it.
func (a *actor) onSplit(id string, start func() error) error {
	if a.io.busy[id] || !a.reserve(id) {
		a.io.later[id] = append(a.io.later[id], start)
		return nil
	}
	err := start()
	if !a.io.busy[id] {
		a.io.unreserve(id, a.job.splits[id])
	}
	return err
}

// next runs the work queued on split id once nothing is in flight on it.
func (a *actor) next(id string) error {
	for !a.io.busy[id] && len(a.io.later[id]) > 0 {
		if !a.reserve(id) {
			return nil // a commit is in flight: its report calls next
		}
		f := a.io.later[id][0]
		if a.io.later[id] = a.io.later[id][1:]; len(a.io.later[id]) == 0 {
			delete(a.io.later, id)
		}
		err := f()
		if !a.io.busy[id] {
			a.io.unreserve(id, a.job.splits[id])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// stop waits for the I/O in flight (its context is cancelled) and folds
// what it learned, so that Close knows of a claim that landed as the loop
// stopped. Nothing new starts.
func (l *loopIO) stop() {
	l.stopping = true
	l.wg.Wait()
	_ = l.runResults()
}

// opKey names an operation that backs off after a failure: a kind, and
// the split it is on if any.
type opKey struct{ op, split string }

// failed holds the operation key back for retryDelay.
func (a *actor) failed(key opKey) {
	at := time.Now().Add(a.c.tm.retry)
	a.io.retry[key] = at
	a.wake.arm(at)
}

// wakeTimer is the loop's one timer: it fires at the earliest time armed
// since it last fired. Arming it has the loop step then (or earlier) even
// if no event arrives: for a retry falling due, or the end of a new job's
// settle window.
type wakeTimer struct {
	t  *time.Timer // nil until the loop starts: arming before that is a no-op
	at time.Time   // when it fires; zero: unarmed
}

func (w *wakeTimer) start() {
	w.t = time.NewTimer(time.Hour)
	w.t.Stop()
}

func (w *wakeTimer) stop() { w.t.Stop() }

// c is the channel the loop selects on.
func (w *wakeTimer) c() <-chan time.Time { return w.t.C }

// fired records that the loop received from c: the next arm sets it anew.
func (w *wakeTimer) fired() { w.at = time.Time{} }

// arm has the timer fire at t, unless it already fires no later.
func (w *wakeTimer) arm(t time.Time) {
	if w.t == nil || !w.at.IsZero() && !t.Before(w.at) {
		return
	}
	w.at = t
	w.t.Reset(max(time.Until(t), 0))
}

// due reports whether the operation key may run at now.
func (l *loopIO) due(key opKey, now time.Time) bool {
	at, ok := l.retry[key]
	if !ok {
		return true
	}
	if now.Before(at) {
		return false
	}
	delete(l.retry, key)
	return true
}
