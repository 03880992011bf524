package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance/internal/kit"
	"github.com/spate-go/spate/faultstore"
)

// CoordinatorRules are the rules of [RunCoordinator] and [CheckCoordinator],
// in the order they run: multi-worker, fault-injection and failover
// scenarios run against the harness's store. Every scenario also checks
// that committed watermarks never regress and that a commit only lands for
// the current owner.
var CoordinatorRules = []Rule{
	{Name: "TwoWorkersPartitionDisjointly",
		Contract: "Two racing workers partition the splits disjointly, hold the partition through a settle, resume from the carried progress and both see AllComplete.",
		body:     scenTwoWorkersPartition},
	{Name: "DeathTakeoverWaitsOutTheLease",
		Contract: "A dead owner's splits move only after its leases expire, with the committed progress, under a higher epoch.",
		body:     scenDeathTakeover},
	{Name: "GracefulReleaseHandsOffWithinALease",
		Contract: "Released splits move to a peer in well under a lease.",
		body:     scenGracefulRelease},
	{Name: "StableIDReclaimsAfterCrash",
		Contract: "A restarted worker with the same instance id reclaims its splits without waiting out the lease, progress intact.",
		body:     scenStableReclaim},
	{Name: "LiveTwinsFailFatal",
		Contract: "Of two live workers with one instance id, one stops Fatal naming the id.",
		body:     scenTwins},
	{Name: "IdleTwinsAreFoundByPresence",
		Contract: "Twins that hold no split are found through their presence record: the older stops Fatal naming the id, the newer keeps running.",
		body:     scenIdleTwins},
	{Name: "FencedZombieCommitWritesNothing",
		Contract: "A commit by an owner whose split was seized is Fenced, Lost follows, and the store keeps the new owner's write.",
		body:     scenZombieCommit},
	{Name: "PoisonSplitQuarantinesAtMaxAttempts",
		Contract: "A split failed by every tenancy is quarantined after exactly max_attempts failures; the final plan ends Stalled, never AllComplete.",
		body:     scenPoison},
	{Name: "RequeuedSplitIsPickedUpWithoutARestart",
		Contract: "A requeued poison split is picked up and the job completes, with no restart.",
		body:     scenRequeue},
	{Name: "DeletedProgressRecordIsRestored",
		Contract: "A progress record deleted out of band is restored by the leader and the job still completes with every split's record present.",
		body:     scenDeletedProgress},
	{Name: "PrunedSplitsLeaveTheStore",
		Contract: "In an open plan, a completed split its planner prunes (its work gone) loses its spec and progress record and is never gained again; completed splits the planner keeps, and live ones, stay.",
		body:     scenPrune},
	{Name: "AllCompleteReachesAnIdleStandby",
		Contract: "A worker that joins after the work is done, and never owns anything, still receives AllComplete.",
		body:     scenIdleStandby},
	{Name: "CompletionReachesEveryWorkerAtOnce",
		Contract: "When the job completes, every worker of a fleet that ends on AllComplete sees it within a second of the first, however soon the first one stops.",
		body:     scenCompletionReachesEveryWorker},
	{Name: "NewcomerGetsHalfByCooperativeRevocation",
		Contract: "A joiner receives half of a loaded worker's splits through cooperative revocation, each resuming from the drained watermark.",
		body:     scenNewcomer},
	{Name: "ThirdWorkerJoiningMidRevocationConverges",
		Contract: "A third worker joining while a revocation is in flight still converges to an even split with every split held.",
		body:     scenThirdJoins},
	{Name: "ZeroRebalanceDelayReassignsPromptly",
		Contract: "With no rebalance delay a crashed worker's splits move promptly.",
		body:     scenZeroDelay},
	{Name: "RebalanceDelayWithholdsADepartedWorkersSplits",
		Contract: "A non-zero rebalance delay withholds a departed worker's splits, then releases them.",
		body:     scenDelayWithholds},
	{Name: "DecliningSourceIsForcedWithinTheDeadline",
		Contract: "A source that declines revocations is forced out within the drain deadline, and exactly the revoked splits move.",
		body:     scenDecline},
	{Name: "DeletedAssignmentReleasesNothing",
		Contract: "Deleting a worker's assignment record is not an instruction to release anything.",
		body:     scenDeletedAssignment},
	{Name: "WithdrawnRevocationIsCancelled",
		Contract: "A revocation the leader takes back is cancelled, not forced.",
		body:     scenWithdrawn},
	{Name: "SilentCancelledDrainIsReleased",
		Contract: "A cancelled revocation whose drain stopped committing is released after a drain deadline of silence, and re-claimed.",
		body:     scenSilentDrain},
	{Name: "RevokingTheLastSplitIsNotADeparture",
		Contract: "Revoking a worker's only split is not a departure: it stays a member and can take work again.",
		body:     scenLastSplit},
	{Name: "SplitsBeyondTheLaneBudgetQueue",
		Contract: "Splits beyond the fleet's lane budget wait, runnable, until a lane frees; they are not quarantined.",
		body:     scenQueue},
	{Name: "DepartureKeepsFinishingHeldSplits",
		Contract: "A departing worker keeps, renews and can finish what it holds, is revoked nothing and claims nothing more.",
		body:     scenDepart},
	{Name: "FailedPlanPublishHeals",
		Contract: "A failed plan publish after seeding heals: the next replan recounts the seeded records, publishes final, and the job completes.",
		body:     scenFailedPublish},
	{Name: "MaybeLandedRenewalIsAdopted",
		Contract: "A renewal that lands but reports an error is adopted on the next beat: no Lost, no quarantine, the split completes.",
		body:     scenMaybeLandedRenewal},
	{Name: "DroppedAssignmentPublishIsRetried",
		Contract: "Failed assignment writes are retried.",
		body:     scenDroppedAssignment},
	{Name: "DroppedOwnerClearStillSurrenders",
		Contract: "A hand-back whose owner-clearing write fails still surrenders the split, and the split is never held twice.",
		body:     scenDroppedOwnerClear},
	{Name: "PartitionedWorkerSelfFencesAndPeerFinishes",
		Contract: "A worker cut off from the store loses its leases by self-fencing, a healthy peer finishes the job, and the healed worker sees the verdict too.",
		body:     scenPartition},
	{Name: "SlowStoreStillCompletes",
		Contract: "A job completes when every operation of one worker takes half the op timeout.",
		body:     scenSlowStore},
	{Name: "BrokenWatchesStillComplete",
		Contract: "A job completes while watch streams keep breaking: re-watching and the reconcile backstop keep it going.",
		body:     scenBrokenWatches},
	{Name: "ConcurrentCommittersKeepTheirLeases",
		Contract: "A worker committing many splits concurrently on a slow store loses no lease, fails no commit while the store itself answers (a witness outside the coordinator measures it), and is charged no attempt.",
		body:     scenConcurrentCommitters},
	{Name: "SlowStoreLanesKeepTheirLeases",
		Contract: "A worker whose every store operation is slow keeps its leases across 16 committing lanes: nothing lost, no commit failed, no attempt charged.",
		body:     scenSlowStoreLanes},
	{Name: "SlowListingsKeepLeases",
		Contract: "A worker whose listings take half a lease keeps its leases: nothing lost, no commit failed, no attempt charged.",
		body:     scenSlowListings},
	{Name: "LeaderDiesAfterAnOpenPhase",
		Contract: "When the leader dies after planning an open phase, the survivor continues the cursor, seals the plan and completes.",
		body:     scenLeaderDies},
	{Name: "OpenPlanGrowsAndCompletesOnceFinal",
		Contract: "An open plan grows across replan ticks and the job completes only once the plan is final.",
		body:     scenOpenPlanGrows},
	{Name: "FinalPlanIsNotReplanned",
		Contract: "Once a plan is final, later leaders do not run the planner again.",
		body:     scenFinalNotReplanned},
	{Name: "StartupProbeRejectsABrokenStore",
		Contract: "A store that does not enforce create-if-absent is rejected before fencing is trusted to it.",
		body:     scenProbe},
	{Name: "FingerprintMismatchIsFatal",
		Contract: "A worker with a different fingerprint is rejected Fatal with both fingerprints in the message.",
		body:     scenFingerprint},
	{Name: "DamagedRecordTakesOnlyItsSplitOutOfPlay",
		Contract: "An unreadable progress record takes only its own split out of play: its tenancy is lost, every other split runs to its end, and the job ends Stalled naming it.",
		body:     scenAlienRecord},
	{Name: "UnreadableAssignmentIsIgnored",
		Contract: "An unreadable assignment is ignored, never read as an empty one.",
		body:     scenBadAssignment},
	{Name: "UnreachableStoreExhaustsTheStartupBudget",
		Contract: "A store that never answers exhausts the startup budget and fails Fatal, never hangs.",
		body:     scenUnreachable},
	{Name: "CommitContract",
		Contract: "A commit for a split not held is Fenced without Lost; a watermark regression is Fatal and stops the coordinator.",
		body:     scenCommitContract},
}

// RunCoordinator runs the coordinator scenarios against the driver behind
// newHarness: several StoreCoordinators share one harness namespace, each
// behind its own fault injector, driven by simulated sources. Over
// stores/mem, pass [VirtualTime] so that lease-length waits cost no wall
// time.
func RunCoordinator(t *testing.T, newHarness HarnessMaker, opts ...Option) {
	runRules(t, "Coordinator", CoordinatorRules, newHarness, opts)
}

// ----- planners ---------------------------------------------------------------

// staticPlanner plans a fixed set of splits (planOf: n of them, final).
type staticPlanner = kit.StaticPlanner

var planOf = kit.PlanOf

// phasedPlanner emits one more phase of splits per run, remembering its
// place only in the plan record's cursor, so a new leader continues it.
type phasedPlanner struct {
	fp     string
	phases [][]string
	mu     sync.Mutex
	runs   []time.Time
}

func (p *phasedPlanner) Fingerprint() string { return p.fp }
func (p *phasedPlanner) Plan(_ context.Context, pc spate.PlanContext) (spate.SplitPlan, error) {
	p.mu.Lock()
	p.runs = append(p.runs, time.Now())
	p.mu.Unlock()
	done := 0
	if len(pc.PlannerState) > 0 {
		fmt.Sscan(string(pc.PlannerState), &done)
	}
	if done < len(p.phases) {
		done++
	}
	var splits []spate.PlannedSplit
	for _, ph := range p.phases[:done] {
		for _, id := range ph {
			splits = append(splits, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(id), []byte(id))))
		}
	}
	fin := spate.PlanOpen
	if done == len(p.phases) {
		fin = spate.PlanFinal
	}
	return spate.NewSplitPlan(splits, fin).WithPlannerState([]byte(fmt.Sprint(done))), nil
}

// ----- store inspection and out-of-band edits ---------------------------------

func inspect(e *env, s spate.Store) *spate.JobState {
	e.t.Helper()
	js, err := spate.InspectJob(e.ctx, s, "")
	if err != nil {
		e.t.Fatalf("inspect: %v", err)
	}
	return js
}

// editRecord rewrites a JSON record out of band with a compare-and-swap,
// as a thief or an operator would.
func editRecord(e *env, s spate.Store, ks spate.Keyspace, key string, edit func(map[string]any)) {
	e.t.Helper()
	en, ok, err := s.Get(e.ctx, ks, key)
	if err != nil || !ok {
		e.t.Fatalf("edit %s %q: read: present=%t err=%v", ks, key, ok, err)
	}
	dec := json.NewDecoder(bytes.NewReader(en.Value))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		e.t.Fatalf("edit %q: %v", key, err)
	}
	edit(m)
	b, _ := json.Marshal(m)
	o, err := s.Update(e.ctx, ks, key, b, en.Revision)
	if err != nil || !o.Won {
		e.t.Fatalf("edit %s %q: write: won=%t err=%v", ks, key, o.Won, err)
	}
}

func num(m map[string]any, k string) int64 {
	n, _ := m[k].(json.Number).Int64()
	return n
}

func leases(f *fleet) time.Duration { return f.cfg.LeaseDuration }

// ----- multi-worker scenarios ---------------------------------------------------

// scenTwoWorkersPartition: two racing workers partition eight splits into
// a disjoint 4/4, hold it through a two-lease settle, resume from the
// carried (seeded) progress, and both see AllComplete.
func scenTwoWorkersPartition(e *env) {
	p := planOf("part", 8)
	for i := range p.Splits {
		p.Splits[i] = p.Splits[i].WithSeed(spate.NewSplitProgress(7, []byte("seed")))
	}
	f := newFleet(e, p)
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a 4/4 split", func() bool { return len(a.held) == 4 && len(b.held) == 4 })
	hA, hB := a.heldIDs(), b.heldIDs()
	for _, id := range hA {
		if slices.Contains(hB, id) {
			e.t.Fatalf("rule: no split is held by two workers; %s held by both", id)
		}
	}
	f.hold(2*leases(f), "the 4/4 split", func() bool {
		return slices.Equal(a.heldIDs(), hA) && slices.Equal(b.heldIDs(), hB)
	})
	seed := spate.NewSplitProgress(7, []byte("seed"))
	for _, w := range []*worker{a, b} {
		f.checkCarried(w, w.gains, &seed)
		if len(w.losses) > 0 {
			e.t.Errorf("rule: a settled fleet loses nothing; %s lost %v", w.name, w.losses)
		}
		w.perTick = 1
	}
	f.until(20*leases(f), "AllComplete on both", func() bool { return a.saw(isAllComplete) && b.saw(isAllComplete) })
	f.checkCommitHistory()
}

// scenDeathTakeover: a dead owner's splits move only after its leases
// expire, with the committed progress, under a higher epoch.
func scenDeathTakeover(e *env) {
	f := newFleet(e, planOf("death", 4))
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	ids := a.heldIDs()
	committed := ids[0]
	st := a.held[committed]
	st.watermark = 5
	if !a.commit(spate.MustSplitID(committed), st, false) {
		e.t.Fatalf("commit by the owner failed")
	}
	epochs := map[string]spate.LeaseEpoch{}
	for id, st := range a.held {
		epochs[id] = st.gained.Epoch
	}
	died := time.Now()
	before := len(b.gains)
	a.kill()
	f.until(10*leases(f), "b taking over a's splits", func() bool { return len(b.held) == 4 })
	took := time.Since(died)
	if took < leases(f)/4 {
		e.t.Errorf("rule: a takeover waits out the dead owner's lease; b took over %v after the death (lease %v)", took, leases(f))
	}
	f.checkCarried(b, b.gains[before:], nil)
	for _, g := range b.gains[before:] {
		id := g.Split.ID.String()
		if _, was := epochs[id]; was && g.Epoch <= epochs[id] {
			e.t.Errorf("rule: a takeover bumps the epoch past the dead tenancy; %s %d -> %d", id, epochs[id], g.Epoch)
		}
		if id == committed && (g.Progress == nil || g.Progress.Watermark != 5) {
			e.t.Errorf("rule: a takeover resumes from the last committed progress; %s carried %v, want watermark 5", id, g.Progress)
		}
	}
	f.checkCommitHistory()
}

// scenGracefulRelease: released splits move in well under a lease.
func scenGracefulRelease(e *env) {
	f := newFleet(e, planOf("rel", 4))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 4 })
	b := f.start("b", withPerTick(0), withConfig(func(c *spate.Config) { c.MaxInFlight = 8 }))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	var ids []spate.SplitID
	for _, id := range a.heldIDs() {
		ids = append(ids, spate.MustSplitID(id))
	}
	// The handoff is a few store round trips and a watch event; a handoff
	// by lease expiry instead takes about a lease. A store or a machine
	// that stalls (a loaded CI machine stalls processes for seconds, and
	// the tests' leases are the stores' 2 s floors) delays the handoff by
	// as long: a witness on a connection of its own measures that, and the
	// handoff must take less than a lease plus the longest call of the
	// witness's that overlapped it (none on a quiet machine: a handoff
	// that waited out the lease still fails).
	wit := startWitness(e, e.h, "relwitness.k", leases(f)/100, leases(f)/10)
	start := time.Now()
	if err := a.c.Release(e.ctx, ids...); err != nil {
		e.t.Fatalf("release: %v", err)
	}
	a.held = map[string]*tenancyState{}
	f.until(3*leases(f), "b gaining the released splits", func() bool { return len(b.held) == 4 })
	handoff := span{start, time.Now()}
	wit.stop()
	stalled := wit.longestDuring(handoff)
	if took := handoff.end.Sub(handoff.start); took >= leases(f)+stalled {
		e.t.Errorf("rule: a graceful release hands off without waiting out the lease; took %v (lease %v; the longest witness call during it took %v)",
			took, leases(f), stalled)
	} else if took >= leases(f) {
		e.t.Logf("the handoff took %v, a lease (%v) or more, while a witness call took %v: the store or the machine stalled", took, leases(f), stalled)
	}
	for _, g := range b.gains[2:] {
		if g.Progress != nil {
			e.t.Errorf("unexpected progress on %v", g)
		}
	}
}

// scenStableReclaim: a restarted worker with the same instance id reclaims
// its splits without waiting out the lease, progress intact.
func scenStableReclaim(e *env) {
	f := newFleet(e, planOf("stable", 3))
	a := f.start("a", withID("stable"), withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 3 })
	for _, id := range a.heldIDs() {
		st := a.held[id]
		st.watermark = 4
		a.commit(spate.MustSplitID(id), st, false)
	}
	a.kill()
	restarted := time.Now()
	a2 := f.start("a2", withID("stable"), withPerTick(0))
	f.until(2*leases(f), "the restarted worker reclaiming", func() bool { return len(a2.held) == 3 })
	if took := time.Since(restarted); took >= leases(f) {
		e.t.Errorf("rule: a stable instance id reclaims its splits in under a lease after a restart; took %v", took)
	}
	for _, g := range a2.gains {
		if g.Progress == nil || g.Progress.Watermark != 4 {
			e.t.Errorf("rule: a reclaim resumes from the committed progress; %v", g)
		}
	}
	f.checkCommitHistory()
}

// scenTwins: two live workers with one instance id: one stops Fatal naming
// the id.
func scenTwins(e *env) {
	f := newFleet(e, planOf("twin", 2))
	a := f.start("a", withID("twin"), withPerTick(0), withExpectErr())
	b := f.start("b", withID("twin"), withPerTick(0), withExpectErr())
	f.until(20*leases(f), "one twin failing", func() bool { return a.err != nil || b.err != nil })
	for _, w := range []*worker{a, b} {
		if w.err != nil && (!spate.IsFatal(w.err) || !strings.Contains(w.err.Error(), `"twin"`)) {
			e.t.Errorf("rule: live twins stop with a Fatal error naming the instance id; %s failed with %v", w.name, w.err)
		}
	}
	survivor := a
	if a.err != nil {
		survivor = b
	}
	f.hold(2*leases(f), "exactly one of two live twins stopping", func() bool { return survivor.err == nil })
	if a.err != nil && b.err != nil {
		e.t.Errorf("rule: of two live twins exactly one (the older) stops; both stopped: a=%v b=%v", a.err, b.err)
	}
	f.until(10*leases(f), "the surviving twin holding both splits", func() bool { return len(survivor.held) == 2 })
}

// scenIdleTwins: twins that hold no split (the job has none, so no lease
// can give them away) are found through their presence record: the older
// one finds its record rewritten by the newer and stops Fatal naming the
// id; the newer keeps running.
func scenIdleTwins(e *env) {
	f := newFleet(e, planOf("idle-twin", 0))
	a := f.start("a", withID("twin"), withPerTick(0), withExpectErr())
	f.until(2*leases(f), "the first twin seeing the (empty) job complete", func() bool { return slices.ContainsFunc(a.events, isAllComplete) })
	b := f.start("b", withID("twin"), withPerTick(0), withExpectErr())
	f.until(3*leases(f), "the older twin failing", func() bool { return a.err != nil || b.err != nil })
	if a.err == nil || !spate.IsFatal(a.err) || !strings.Contains(a.err.Error(), `"twin"`) {
		e.t.Errorf("rule: of two live twins the older stops with a Fatal error naming the instance id; it ended with %v", a.err)
	}
	f.hold(leases(f), "the newer twin running", func() bool { return b.err == nil })
}

// scenZombieCommit: a thief seizes a split out of band; the victim's next
// commit is Fenced, Lost follows, and the store keeps the thief's write.
func scenZombieCommit(e *env) {
	f := newFleet(e, planOf("zombie", 1))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding the split", func() bool { return len(a.held) == 1 })
	id := a.heldIDs()[0]
	key := "split." + id
	// Blind the victim (no watch, no listing), so that it learns of the
	// theft only through its commit's compare-and-swap: the fence itself.
	a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Watch, faultstore.List}})
	a.inj.BreakWatches()
	raw := e.open()
	editRecord(e, raw, spate.Ephemeral, key, func(m map[string]any) {
		m["owner"], m["nonce"], m["epoch"] = "thief", "thief-nonce", json.Number(fmt.Sprint(num(m, "epoch")+1))
	})
	editRecord(e, raw, spate.Durable, key, func(m map[string]any) {
		m["owner"], m["epoch"], m["watermark"] = "thief", json.Number(fmt.Sprint(num(m, "epoch")+1)), json.Number("100")
	})
	before, _, _ := raw.Get(e.ctx, spate.Durable, key)
	st := a.held[id]
	st.watermark = 3
	err := a.c.Commit(e.ctx, spate.MustSplitID(id), spate.NewSplitProgress(3, nil))
	if !spate.IsFenced(err) {
		if err == nil {
			e.t.Fatalf("rule: a commit from a worker that no longer owns the split is Fenced; it succeeded")
		}
		// The watch may already have fenced the tenancy: then the commit is
		// Fenced as "not held". Either way it must be Fenced.
		e.t.Fatalf("rule: a commit from a fenced owner returns ErrFenced; got %v", err)
	}
	f.until(leases(f), "Lost after the fenced commit", func() bool { return slices.Contains(a.losses, id) })
	after, _, _ := raw.Get(e.ctx, spate.Durable, key)
	if !bytes.Equal(before.Value, after.Value) || before.Revision != after.Revision {
		e.t.Errorf("rule: a fenced commit writes nothing; the record changed from %s@%d to %s@%d",
			before.Value, before.Revision, after.Value, after.Revision)
	}
	if err := a.c.Commit(e.ctx, spate.MustSplitID(id), spate.NewSplitProgress(3, nil)); !spate.IsFenced(err) {
		e.t.Errorf("rule: a commit on a split not held is Fenced; got %v", err)
	}
}

// scenPoison: a split failed by every tenancy is quarantined after exactly
// max_attempts failures; the final plan ends Stalled, never AllComplete.
func scenPoison(e *env) {
	p := planOf("poison", 2)
	f := newFleet(e, p)
	poison := p.Splits[0].Spec.ID.String()
	a := f.start("a", withFailIf(func(id string) bool { return id == poison }))
	f.until(30*leases(f), "Stalled", func() bool { return a.saw(isStalled) })
	if a.saw(isAllComplete) {
		e.t.Errorf("rule: a quarantined split blocks AllComplete")
	}
	var st spate.Stalled
	for _, ev := range a.events {
		if s, ok := ev.(spate.Stalled); ok {
			st = s
		}
	}
	if st.Completed != 1 || st.Quarantined != 1 {
		e.t.Errorf("rule: Stalled counts completed and quarantined splits; got %+v, want 1 and 1", st)
	}
	max := f.cfg.WithDefaults().MaxAttempts
	if a.fails != max {
		e.t.Errorf("rule: a poison split is quarantined after exactly max_attempts (%d) failures; it took %d", max, a.fails)
	}
	js := inspect(e, e.open())
	s, _ := js.Split(poison)
	if s.Status != spate.StatusQuarantined || int(s.Attempts) != max {
		e.t.Errorf("rule: the quarantined record shows its attempts; got %v", s)
	}
}

// scenRequeue: a poison split stalls the job; once the operator requeues
// it (its input fixed), the running workers withdraw their Stalled verdict,
// pick it up and complete the job, with no restart.
func scenRequeue(e *env) {
	p := planOf("requeue", 2)
	f := newFleet(e, p)
	poison := p.Splits[0].Spec.ID
	fixed := false
	a := f.start("a", withFailIf(func(id string) bool { return !fixed && id == poison.String() }))
	b := f.start("b", withFailIf(func(id string) bool { return !fixed && id == poison.String() }))
	f.until(30*leases(f), "Stalled on both workers", func() bool { return a.saw(isStalled) && b.saw(isStalled) })
	fixed = true
	if err := spate.RequeueSplit(e.ctx, e.open(), p.FP, poison); err != nil {
		e.t.Fatalf("requeue: %v", err)
	}
	f.until(30*leases(f), "AllComplete after the requeue", func() bool { return a.saw(isAllComplete) || b.saw(isAllComplete) })
	js := inspect(e, e.open())
	if s, _ := js.Split(poison.String()); s.Status != spate.StatusCompleted {
		e.t.Errorf("rule: a requeued split is picked up by the running workers and completed; it is %v", s)
	}
	f.checkCommitHistory()
}

// scenDeletedProgress: a split's progress record is deleted out of band
// while a worker holds it; the holder loses it, the leader restores the
// record from the last state seen, and the job still completes with every
// split's record present (it used to hang at "100%" for ever).
func scenDeletedProgress(e *env) {
	p := planOf("deleted", 3)
	f := newFleet(e, p)
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "every split held", func() bool { return len(a.held)+len(b.held) == 3 })
	raw := e.open()
	victim := p.Splits[0].Spec.ID.String()
	if _, err := raw.Delete(e.ctx, spate.Durable, "split."+victim, spate.AnyRevision); err != nil {
		e.t.Fatalf("deleting the record: %v", err)
	}
	a.perTick, b.perTick = 5, 5
	f.until(30*leases(f), "AllComplete after the record was deleted", func() bool { return a.saw(isAllComplete) && b.saw(isAllComplete) })
	js := inspect(e, raw)
	if s, ok := js.Split(victim); !ok || s.Status != spate.StatusCompleted {
		e.t.Errorf("rule: a deleted progress record is restored and its split completed; it is %v (present %t)", s, ok)
	}
}

// prunePlanner is an open plan of files that come and go: it plans the
// live ones, and prunes (retention 0) the completed splits of those gone.
type prunePlanner struct {
	mu   sync.Mutex
	live []string
	gone map[string]bool
}

func (p *prunePlanner) Fingerprint() string { return "conformance:prune" }

func (p *prunePlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ss []spate.PlannedSplit
	for _, id := range p.live {
		ss = append(ss, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(id), []byte("file:"+id))))
	}
	return spate.NewSplitPlan(ss, spate.PlanOpen), nil
}

func (p *prunePlanner) Prune(_ context.Context, done []spate.DoneSplit) ([]spate.SplitID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []spate.SplitID
	for _, d := range done {
		if p.gone[d.Spec.ID.String()] {
			out = append(out, d.Spec.ID)
		}
	}
	return out, nil
}

// scenPrune: an open plan's worker completes four splits; two of them
// are then gone (and a fifth appears). The leader prunes those two: their
// spec and progress record are deleted from the store (each a
// revision-guarded single-key delete), no view restores them and nobody
// gains them again, while the completed splits the planner keeps and the
// new one stay. Pruning is the only delete of a spec, so a store whose
// guarded delete misbehaves shows here.
func scenPrune(e *env) {
	p := &prunePlanner{live: []string{"prune-00", "prune-01", "prune-02", "prune-03"}, gone: map[string]bool{}}
	f := newFleet(e, p)
	a := f.start("a")
	raw := e.open()
	completed := func(ids ...string) func() bool {
		return func() bool {
			js, err := spate.InspectJob(e.ctx, raw, "")
			if err != nil {
				return false
			}
			for _, id := range ids {
				if s, ok := js.Split(id); !ok || s.Status != spate.StatusCompleted {
					return false
				}
			}
			return true
		}
	}
	f.until(30*leases(f), "four splits completed", completed("prune-00", "prune-01", "prune-02", "prune-03"))
	p.mu.Lock()
	p.live = []string{"prune-02", "prune-03", "prune-04"}
	p.gone["prune-00"], p.gone["prune-01"] = true, true
	p.mu.Unlock()
	pruned := func() bool {
		for _, id := range []string{"prune-00", "prune-01"} {
			for _, key := range []string{"spec." + id, "split." + id} {
				if _, ok, err := raw.Get(e.ctx, spate.Durable, key); err != nil || ok {
					return false
				}
			}
		}
		return true
	}
	// The leader replans every ReplanInterval (a lease) and prunes after
	// each run of the open plan.
	f.until(30*leases(f), "the gone splits' records deleted and the new split completed", func() bool {
		return pruned() && completed("prune-04")()
	})
	// Two more replans: nothing comes back, nothing else goes.
	f.hold(2*leases(f), "the pruned splits staying gone", pruned)
	js := inspect(e, raw)
	for _, id := range []string{"prune-02", "prune-03", "prune-04"} {
		if s, ok := js.Split(id); !ok || s.Status != spate.StatusCompleted {
			e.t.Errorf("rule: a completed split the planner keeps stays in the store; %s is %v (present %t)", id, s, ok)
		}
	}
	for _, id := range []string{"prune-00", "prune-01"} {
		if _, ok := js.Split(id); ok {
			e.t.Errorf("rule: a pruned split leaves every view; %s is still listed", id)
		}
	}
	gained := map[string]int{}
	for _, g := range a.gains {
		gained[g.Split.ID.String()]++
	}
	for id, n := range gained {
		if n > 1 {
			e.t.Errorf("rule: a split is gained once here (one worker, no fault); %s was gained %d times", id, n)
		}
	}
}

// scenIdleStandby: a worker that joins after the work is done, and never
// owns anything, still receives AllComplete.
func scenIdleStandby(e *env) {
	f := newFleet(e, planOf("standby", 3))
	a := f.start("a")
	f.until(30*leases(f), "a completing the job", func() bool { return a.saw(isAllComplete) })
	b := f.start("b")
	f.until(10*leases(f), "AllComplete on the late standby", func() bool { return b.saw(isAllComplete) })
	if len(b.gains) > 0 {
		e.t.Errorf("the standby gained %v", b.gains)
	}
}

// scenCompletionReachesEveryWorker: three workers share a job, and each
// stops (Close) as soon as it sees AllComplete, the way a pipeline ends.
// The first to see it judged the job; it records the verdict for workers
// that do not watch the whole job (decision 020), so the others must see
// AllComplete within completionBound of it: never only once each has
// become the leader itself and judged the job afresh.
func scenCompletionReachesEveryWorker(e *env) {
	f := newFleet(e, planOf("done", 6))
	// Every call takes a real store's round trip, longer than a pump: the
	// first worker stops before a write it starts on seeing the verdict
	// could land.
	lag := max(2*f.tick, f.cfg.OpTimeout/4)
	var ws []*worker
	for _, name := range []string{"a", "b", "c"} {
		w := f.startPaused(name)
		w.inj.Add(faultstore.Rule{Delay: lag})
		f.launch(w)
		ws = append(ws, w)
	}
	seen := map[string]time.Time{}
	var closing sync.WaitGroup
	e.t.Cleanup(closing.Wait) // before the fleet's cleanup and the harness's
	f.until(30*leases(f), "AllComplete on every worker", func() bool {
		for _, w := range ws {
			if _, ok := seen[w.name]; !ok && w.saw(isAllComplete) {
				seen[w.name] = time.Now()
				// A pipeline ends on AllComplete and closes its
				// coordinator. Closed beside the pump, so that one
				// worker's Close does not delay seeing the next one's
				// event.
				w.dead = true
				closing.Go(func() {
					_ = w.c.Close()
					_ = w.store.Close()
				})
			}
		}
		return len(seen) == len(ws)
	})
	first := slices.MinFunc(slices.Collect(maps.Values(seen)), time.Time.Compare)
	bound := completionBound(e, f)
	for _, w := range ws {
		e.t.Logf("%s saw AllComplete %v after the first", w.name, seen[w.name].Sub(first))
		if late := seen[w.name].Sub(first); late > bound {
			e.t.Errorf("rule: every worker sees AllComplete within %v of the first; %s saw it %v later", bound, w.name, late)
		}
	}
}

// completionBound is how late after the first worker another may see
// AllComplete. In virtual time, one second: the first worker's Close, its
// verdict write (two calls) and one watch delivery take a few store round
// trips (about 250 ms over stores/mem with every call slowed to a quarter
// of the op timeout; the successions it replaced took 1.5 s). In real
// time, where a loaded machine can stretch any delivery, a lease (at
// least a second): still short of a chain of successions, each of which
// elects a leader, opens its whole-job watches and lists the job.
func completionBound(e *env, f *fleet) time.Duration {
	if e.virtual {
		return time.Second
	}
	return max(time.Second, leases(f))
}

// scenNewcomer: a joiner receives half of a loaded worker's splits through
// cooperative revocation, each resuming from the drained watermark.
func scenNewcomer(e *env) {
	f := newFleet(e, planOf("newcomer", 6))
	a := f.start("a", withRecords(1<<40), withCommitEvery(2))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 6 })
	f.until(10*leases(f), "a making progress", func() bool {
		for _, st := range a.held {
			if st.committed < 2 {
				return false
			}
		}
		return true
	})
	b := f.start("b", withRecords(1<<40), withPerTick(0))
	f.until(10*leases(f), "a 3/3 split", func() bool { return len(a.held) == 3 && len(b.held) == 3 })
	f.hold(leases(f), "the 3/3 split", func() bool { return len(a.held) == 3 && len(b.held) == 3 })
	if len(a.losses) > 0 {
		e.t.Errorf("rule: a cooperative revocation hands splits back without a loss; a lost %v", a.losses)
	}
	for _, g := range b.gains {
		if g.Epoch > 2 {
			e.t.Errorf("rule: a rebalance moves a split once (no ping-pong between recomputes); %s reached epoch %d", g.Split.ID, g.Epoch)
		}
	}
	if len(a.gains) != 6 {
		e.t.Errorf("rule: a worker giving splits up in a rebalance does not claim them back; a gained %d times", len(a.gains))
	}
	for _, g := range b.gains {
		cs := f.commits[g.Split.ID.String()]
		if len(cs) == 0 {
			e.t.Fatalf("no commits recorded for %s", g.Split.ID)
		}
		last := cs[len(cs)-1]
		if g.Progress == nil || g.Progress.Watermark != last.watermark {
			e.t.Errorf("rule: a drained split resumes from the drained watermark; %s carried %v, the last commit was %d",
				g.Split.ID, g.Progress, last.watermark)
		}
	}
	f.checkCommitHistory()
}

// scenThirdJoins: a third worker joining while a revocation is in flight
// still converges to 2/2/2 with every split held.
func scenThirdJoins(e *env) {
	f := newFleet(e, planOf("third", 6))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 6 })
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a revocation in flight", func() bool { return len(a.revokes) > 0 })
	c := f.start("c", withPerTick(0))
	f.until(20*leases(f), "a 2/2/2 split", func() bool {
		return len(a.held) == 2 && len(b.held) == 2 && len(c.held) == 2
	})
}

// scenZeroDelay: with no rebalance delay a crashed worker's splits move
// promptly.
func scenZeroDelay(e *env) {
	f := newFleet(e, planOf("zero", 4))
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	died := time.Now()
	a.kill()
	f.until(3*leases(f), "b taking over promptly", func() bool { return len(b.held) == 4 })
	e.t.Logf("takeover after %v (lease %v)", time.Since(died), leases(f))
}

// scenDelayWithholds: a non-zero rebalance delay really withholds a
// departed worker's splits, then releases them.
func scenDelayWithholds(e *env) {
	f := newFleet(e, planOf("delay", 4))
	delay := func(c *spate.Config) { c.RebalanceDelay = 5 * c.LeaseDuration }
	a := f.start("a", withPerTick(0), withConfig(delay))
	b := f.start("b", withPerTick(0), withConfig(delay))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	a.kill()
	f.hold(3*leases(f), "the rebalance delay withholding a's splits", func() bool { return len(b.held) == 2 })
	f.until(8*leases(f), "b taking over after the delay", func() bool { return len(b.held) == 4 })
}

// scenDecline: a source that declines revocations is forced out within the
// drain deadline, and exactly the revoked splits move.
func scenDecline(e *env) {
	f := newFleet(e, planOf("decline", 6))
	a := f.start("a", withPerTick(0), withRevoke(revokeDecline))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 6 })
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a revocation", func() bool { return len(a.revokes) > 0 })
	asked := time.Now()
	f.until(leases(f), "b gaining the revoked splits", func() bool { return len(b.held) == 3 })
	if took := time.Since(asked); took >= leases(f) {
		e.t.Errorf("rule: a declined revocation is forced at once; the move took %v", took)
	}
	var moved []string
	for _, g := range b.gains {
		moved = append(moved, g.Split.ID.String())
	}
	slices.Sort(moved)
	revoked := slices.Clone(a.revokes)
	slices.Sort(revoked)
	if !slices.Equal(moved, slices.Compact(revoked)) {
		e.t.Errorf("rule: the splits that move are exactly the ones revoked; moved %v, revoked %v", moved, revoked)
	}
}

// scenDeletedAssignment: deleting a worker's assignment record is not an
// instruction to release anything.
func scenDeletedAssignment(e *env) {
	f := newFleet(e, planOf("delassign", 3))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 3 })
	raw := e.open()
	if o, err := raw.Delete(e.ctx, spate.Durable, "assign.a", spate.AnyRevision); err != nil || !o.Won {
		e.t.Fatalf("delete assignment: %v", err)
	}
	f.hold(leases(f), "a keeping its splits", func() bool { return len(a.held) == 3 })
	if len(a.losses) > 0 || len(a.revokes) > 0 {
		e.t.Errorf("rule: absence of an assignment is not an instruction to hold nothing; a saw losses %v and revocations %v", a.losses, a.revokes)
	}
}

// scenWithdrawn: a revocation the leader takes back (the joiner died
// mid-drain) is cancelled, not forced.
func scenWithdrawn(e *env) {
	f := newFleet(e, planOf("withdrawn", 4))
	a := f.start("a", withPerTick(0), withRevoke(revokeSlow))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 4 })
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a revocation", func() bool { return len(a.revokes) > 0 })
	b.stop() // the joiner leaves: the leader names everything for a again
	f.hold(2*f.cfg.DrainDeadline+leases(f), "a keeping every split", func() bool { return len(a.held) == 4 })
	if len(a.losses) > 0 {
		e.t.Errorf("rule: a withdrawn revocation is cancelled, not forced; a lost %v", a.losses)
	}
}

// scenSilentDrain: a cancelled revocation whose drain stopped committing is
// released after a drain deadline of silence, and re-claimed.
func scenSilentDrain(e *env) {
	f := newFleet(e, planOf("silent", 4))
	a := f.start("a", withPerTick(0), withRevoke(revokeStall))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 4 })
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a revocation", func() bool { return len(a.revokes) > 0 })
	victim := a.revokes[0]
	b.kill()
	f.until(10*leases(f), "the wedged drain being released", func() bool { return slices.Contains(a.losses, victim) })
	f.until(10*leases(f), "a re-claiming it", func() bool {
		st, ok := a.held[victim]
		return ok && !st.draining
	})
}

// scenLastSplit: revoking a worker's only split is not a departure: it
// stays a member and can take work again.
func scenLastSplit(e *env) {
	f := newFleet(e, planOf("last", 1))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding the split", func() bool { return len(a.held) == 1 })
	// A newer-generation leader decision that names nothing for a.
	raw := e.open()
	js := inspect(e, raw)
	editRecord(e, raw, spate.Durable, "assign.a", func(m map[string]any) {
		m["generation"] = json.Number(fmt.Sprint(js.Plan.Generation + 1000))
		m["splits"] = []any{}
	})
	f.until(5*leases(f), "the drained hand-back", func() bool { return len(a.held) == 0 })
	f.hold(leases(f), "a staying a member", func() bool {
		for _, m := range inspect(e, raw).Members {
			if m.Instance == "a" {
				return true
			}
		}
		return false
	})
	// The leader (a) republishes and a takes its lane back.
	editRecord(e, raw, spate.Durable, "assign.a", func(m map[string]any) {
		m["generation"] = json.Number(fmt.Sprint(js.Plan.Generation + 2000))
		m["splits"] = []any{"last-00"}
	})
	f.until(5*leases(f), "a claiming again", func() bool { return len(a.held) == 1 })
}

// scenQueue: splits beyond the fleet's lane budget wait, runnable, until a
// lane frees; they are not quarantined.
func scenQueue(e *env) {
	f := newFleet(e, planOf("queue", 4))
	one := func(n int) workerOpt { return withConfig(func(c *spate.Config) { c.MaxInFlight = n }) }
	a := f.start("a", withPerTick(0), one(2))
	f.until(10*leases(f), "a at its budget", func() bool { return len(a.held) == 2 })
	f.hold(2*leases(f), "a staying at its budget", func() bool { return len(a.held) == 2 })
	raw := e.open()
	for _, s := range inspect(e, raw).Splits {
		if s.Status != spate.StatusRunnable || s.Attempts != 0 {
			e.t.Errorf("rule: queued splits stay runnable and consume nothing; %v", s)
		}
	}
	b := f.start("b", withPerTick(0), one(1))
	f.until(10*leases(f), "b picking one up", func() bool { return len(b.held) == 1 && len(a.held) == 2 })
}

// ----- fault injection ----------------------------------------------------------

// scenFailedPublish: the plan publish after seeding fails; the next replan
// recounts the seeded records, publishes final, and the job completes.
func scenFailedPublish(e *env) {
	f := newFleet(e, planOf("publish", 3))
	a := f.startPaused("a")
	// The first plan update is the generation bump; fail the second (the
	// publish).
	a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "plan", Skip: 1, Times: 1})
	f.launch(a)
	f.until(30*leases(f), "AllComplete", func() bool { return a.saw(isAllComplete) })
	js := inspect(e, e.open())
	if js.Plan.Planned != 3 || js.Plan.Finality != spate.PlanFinal {
		e.t.Errorf("rule: a failed publish heals on the next replan; plan %+v", js.Plan)
	}
	if a.inj.Injected() == 0 {
		e.t.Errorf("the publish fault never fired")
	}
}

// scenMaybeLandedRenewal: a renewal that lands but reports an error is
// adopted on the next beat: no Lost, no quarantine, the split completes.
func scenMaybeLandedRenewal(e *env) {
	f := newFleet(e, planOf("maybe", 1))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding the split", func() bool { return len(a.held) == 1 })
	// A lease bound to a session (a store with spate.Sessioner) is renewed
	// by the session's KeepAlive, anything else by an Update of the lease.
	if _, ok := spate.SessionerOf(e.open()); ok {
		a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.KeepAlive}, Keyspace: spate.Ephemeral, Landed: true, Times: 2})
	} else {
		a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Ephemeral, KeyPrefix: "split.", Landed: true, Times: 2})
	}
	f.hold(2*leases(f), "a keeping the split", func() bool { return len(a.held) == 1 })
	if len(a.losses) > 0 || a.saw(func(ev spate.Event) bool { _, ok := ev.(spate.Quarantined); return ok }) {
		e.t.Errorf("rule: a maybe-landed renewal is adopted, not a loss; events %v", a.events)
	}
	a.perTick = 5
	f.until(10*leases(f), "AllComplete", func() bool { return a.saw(isAllComplete) })
	if a.inj.Injected() < 2 {
		e.t.Errorf("the renewal fault fired %d times, want 2", a.inj.Injected())
	}
}

// scenDroppedAssignment: failed assignment writes are retried.
func scenDroppedAssignment(e *env) {
	f := newFleet(e, planOf("dropassign", 3))
	a := f.startPaused("a", withPerTick(0))
	a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Create, faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "assign.", Times: 3})
	f.launch(a)
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 3 })
}

// scenDroppedOwnerClear: a revocation hand-back whose owner-clearing write
// fails still surrenders the split: the lease goes, a peer takes over, and
// the split is never held twice.
func scenDroppedOwnerClear(e *env) {
	f := newFleet(e, planOf("ownerclear", 4))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 4 })
	a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "split.", Times: 1,
		Match: func(c faultstore.Call) bool { return bytes.Contains(c.Value, []byte(`"owner":null`)) }})
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "b taking over half", func() bool {
		for id := range b.held {
			if _, both := a.held[id]; both {
				e.t.Fatalf("rule: a split is never held twice; %s held by a and b", id)
			}
		}
		return len(b.held) == 2 && len(a.held) == 2
	})
	if a.inj.Injected() != 1 {
		e.t.Errorf("the owner-clear fault fired %d times, want 1", a.inj.Injected())
	}
}

// scenPartition: a worker cut off from the store loses its leases by
// self-fencing, a healthy peer finishes the job, and the healed worker sees
// the verdict too.
func scenPartition(e *env) {
	f := newFleet(e, planOf("partition", 4))
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	a.inj.Partition()
	cut := time.Now()
	f.until(3*leases(f), "a self-fencing", func() bool { return len(a.held) == 0 })
	if took := time.Since(cut); took < leases(f)/2 {
		e.t.Errorf("self-fenced after only %v", took)
	}
	b.perTick = 5
	f.until(20*leases(f), "b finishing the job", func() bool { return b.saw(isAllComplete) })
	a.inj.Heal()
	f.until(20*leases(f), "the healed worker seeing AllComplete", func() bool { return a.saw(isAllComplete) })
	f.checkCommitHistory()
}

// scenSlowStore: every operation of one worker is slow (half the op
// timeout); the job still completes.
func scenSlowStore(e *env) {
	f := newFleet(e, planOf("slow", 4))
	a := f.startPaused("a")
	a.inj.Add(faultstore.Rule{Delay: f.cfg.OpTimeout / 2})
	f.launch(a)
	b := f.start("b")
	f.until(40*leases(f), "AllComplete", func() bool { return a.saw(isAllComplete) && b.saw(isAllComplete) })
	f.checkCommitHistory()
}

// scenBrokenWatches: watch streams keep breaking; re-watching and the
// reconcile backstop keep the job going.
func scenBrokenWatches(e *env) {
	f := newFleet(e, planOf("broken", 6))
	a := f.start("a", withRecords(40))
	b := f.start("b", withRecords(40))
	deadline := time.Now().Add(40 * leases(f))
	for !(a.saw(isAllComplete) && b.saw(isAllComplete)) {
		if time.Now().After(deadline) {
			e.t.Fatalf("no AllComplete with broken watches; %s", f.describe())
		}
		a.inj.BreakWatches()
		b.inj.BreakWatches()
		f.until(40*leases(f), "progress", func() bool { return true })
		time.Sleep(f.cfg.LeaseDuration / 5)
	}
	f.checkCommitHistory()
}

// ----- leader failover ------------------------------------------------------------

// scenLeaderDies: the leader dies after planning an open phase; the
// survivor takes over leadership, continues the cursor, seals the plan and
// completes; the store holds exactly the two splits.
func scenLeaderDies(e *env) {
	p := &phasedPlanner{fp: "conformance:leader", phases: [][]string{{"phase-a"}, {"phase-b"}}}
	f := newFleet(e, p)
	a := f.start("a", withPerTick(0))
	raw := e.open()
	f.until(10*leases(f), "the first phase planned", func() bool {
		js, err := spate.InspectJob(e.ctx, raw, "")
		return err == nil && js.Plan.Planned == 1
	})
	b := f.start("b", withPerTick(0))
	f.until(5*leases(f), "b joined", func() bool { return len(inspect(e, raw).Members) == 2 })
	a.kill()
	b.perTick = 5
	f.until(30*leases(f), "AllComplete on b", func() bool { return b.saw(isAllComplete) })
	js := inspect(e, raw)
	if len(js.Splits) != 2 || js.Plan.Planned != 2 || js.Plan.Finality != spate.PlanFinal || js.Plan.Generation < 2 {
		e.t.Errorf("rule: a new leader continues the planner cursor idempotently; store has %d splits, plan %+v", len(js.Splits), js.Plan)
	}
}

// scenOpenPlanGrows: an open plan grows across replan ticks and the job
// completes only once the plan is final.
func scenOpenPlanGrows(e *env) {
	p := &phasedPlanner{fp: "conformance:grow", phases: [][]string{{"grow-1"}, {"grow-2"}, {"grow-3"}}}
	f := newFleet(e, p)
	began := time.Now() // the worker's replan ticker starts after this
	a := f.start("a", withPerTick(5))
	raw := e.open()
	f.until(40*leases(f), "AllComplete", func() bool {
		if a.saw(isAllComplete) {
			return true
		}
		return false
	})
	js := inspect(e, raw)
	if js.Plan.Planned != 3 || js.Plan.Finality != spate.PlanFinal {
		e.t.Errorf("rule: the plan ends with every phase, final; %+v", js.Plan)
	}
	p.mu.Lock()
	runs := slices.Clone(p.runs)
	p.mu.Unlock()
	if len(runs) < 3 {
		e.t.Fatalf("planner ran %d times", len(runs))
	}
	// The first run is the leader's, once elected, at any point of its
	// replan ticker's period (on a loaded machine an election can take
	// most of one); a re-run of the open plan waits for a tick, and the
	// first tick comes a replan interval after the worker started, however
	// late the first run was.
	if at := runs[1].Sub(began); at < f.cfg.ReplanInterval {
		e.t.Errorf("rule: an open plan is re-run on the replan interval, not at once; second run %v after the worker started (first run after %v), before its first replan tick (interval %v)",
			at, runs[0].Sub(began), f.cfg.ReplanInterval)
	}
	// Completion must not have come before the last phase existed.
	for _, ev := range a.events {
		if isAllComplete(ev) && len(a.gains) < 3 {
			e.t.Errorf("rule: AllComplete waits for a final plan")
		}
	}
}

// ----- startup and records ------------------------------------------------------

// scenProbe: a store that does not enforce create-if-absent is rejected
// before fencing is trusted to it.
func scenProbe(e *env) {
	s := e.open()
	cfg := testConfig(s.Capabilities().TTL)
	cfg.InstanceID = "prober"
	c, err := spate.NewStoreCoordinator(&overwritingStore{Store: s}, cfg, spate.WithLogger(testLogger("prober")))
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(planOf("probe", 1)); err != nil {
		e.t.Fatal(err)
	}
	err = waitFailure(e, c, 10*cfg.LeaseDuration)
	if !spate.IsFatal(err) || !strings.Contains(err.Error(), "create-if-absent") {
		e.t.Errorf("rule: the startup probe rejects a store without create-if-absent, Fatal; got %v", err)
	}
}

// overwritingStore turns create into an upsert: a broken store.
type overwritingStore struct{ spate.Store }

func (s *overwritingStore) Create(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
	o, err := s.Store.Create(ctx, ks, key, v)
	if err != nil || o.Won {
		return o, err
	}
	cur, _, err := s.Store.Get(ctx, ks, key)
	if err != nil {
		return spate.Outcome{}, err
	}
	return s.Store.Update(ctx, ks, key, v, cur.Revision)
}

func waitFailure(e *env, c *spate.StoreCoordinator, d time.Duration) error {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := c.Poll(); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// scenFingerprint: a worker with a different fingerprint is rejected Fatal
// with both fingerprints in the message.
func scenFingerprint(e *env) {
	f := newFleet(e, planOf("fp", 1))
	a := f.start("a")
	f.until(10*leases(f), "a holding the split", func() bool { return len(a.held) == 1 || a.saw(isAllComplete) })
	f.planner = &staticPlanner{FP: "conformance:other", Finality: spate.PlanFinal}
	b := f.start("b", withExpectErr())
	f.until(10*leases(f), "b failing", func() bool { return b.err != nil })
	if !spate.IsFatal(b.err) || !strings.Contains(b.err.Error(), "conformance:fp") || !strings.Contains(b.err.Error(), "conformance:other") {
		e.t.Errorf("rule: a fingerprint mismatch is Fatal and shows both fingerprints; got %v", b.err)
	}
}

// scenAlienRecord: an unreadable progress record (corrupt, or another
// job's) takes only its own split out of play: its tenancy is lost, every
// other split runs to its end, nothing stops, and the job ends Stalled
// naming the damaged splits, the one overwritten and an intruder alike.
func scenAlienRecord(e *env) {
	raw := e.open()
	f := newFleet(e, planOf("alien", 3))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding the splits", func() bool { return len(a.held) == 3 })
	victim := sortedKeys(a.held)[0]
	en, ok, err := raw.Get(e.ctx, spate.Durable, "split."+victim)
	if err != nil || !ok {
		e.t.Fatalf("get split.%s: ok=%t err=%v", victim, ok, err)
	}
	if o, err := raw.Update(e.ctx, spate.Durable, "split."+victim, []byte(`{"not":"ours"}`), en.Revision); err != nil || !o.Won {
		e.t.Fatalf("overwrite split.%s: won=%t err=%v", victim, o.Won, err)
	}
	if _, err := raw.Create(e.ctx, spate.Durable, "split.intruder", []byte(`{"not":"ours"}`)); err != nil {
		e.t.Fatal(err)
	}
	f.until(10*leases(f), "a losing the damaged split", func() bool { return slices.Contains(a.losses, victim) })
	a.perTick = 1
	f.until(30*leases(f), "Stalled", func() bool { return a.saw(isStalled) })
	if a.err != nil {
		e.t.Errorf("rule: a damaged record stops nothing; a failed: %v", a.err)
	}
	for _, ev := range a.events {
		if st, ok := ev.(spate.Stalled); ok {
			want := []string{"intruder", victim}
			slices.Sort(want)
			if st.Completed != 2 || !slices.Equal(st.Damaged, want) {
				e.t.Errorf("rule: the job ends Stalled with the other splits completed, naming the damaged ones; got %v", st)
			}
		}
	}
	if len(a.losses) != 1 {
		e.t.Errorf("rule: only the damaged split's tenancy ends; a lost %v", a.losses)
	}
}

// scenBadAssignment: an unreadable assignment is ignored, never read as an
// empty one (which would release everything).
func scenBadAssignment(e *env) {
	raw := e.open()
	f := newFleet(e, planOf("badassign", 2))
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding everything", func() bool { return len(a.held) == 2 })
	en, _, _ := raw.Get(e.ctx, spate.Durable, "assign.a")
	if o, err := raw.Update(e.ctx, spate.Durable, "assign.a", []byte("garbage"), en.Revision); err != nil || !o.Won {
		e.t.Fatalf("write garbage: %v", err)
	}
	f.hold(leases(f), "a keeping its splits", func() bool { return len(a.held) == 2 })
	if len(a.revokes) > 0 || len(a.losses) > 0 {
		e.t.Errorf("rule: an unreadable assignment is ignored; a saw revocations %v, losses %v", a.revokes, a.losses)
	}
}

// scenUnreachable: a store that never answers exhausts the startup budget
// and fails Fatal, never hangs.
func scenUnreachable(e *env) {
	f := newFleet(e, planOf("unreach", 1))
	a := f.startPaused("a", withExpectErr(), withConfig(func(c *spate.Config) { c.StartupMaxAttempts = 3 }))
	a.inj.Partition()
	f.launch(a)
	f.until(30*time.Second, "the startup budget running out", func() bool { return a.err != nil })
	if !spate.IsFatal(a.err) || !strings.Contains(a.err.Error(), "3 times") {
		e.t.Errorf("rule: an unreachable store exhausts the startup budget with a Fatal error; got %v", a.err)
	}
}

// scenCommitContract: Fenced without Lost for a split not held; Fatal for a
// watermark regression (and the coordinator stops).
func scenCommitContract(e *env) {
	f := newFleet(e, planOf("commit", 1))
	a := f.start("a", withPerTick(0), withExpectErr())
	f.until(10*leases(f), "a holding the split", func() bool { return len(a.held) == 1 })
	if err := a.c.Commit(e.ctx, spate.MustSplitID("not-mine"), spate.NewSplitProgress(1, nil)); !spate.IsFenced(err) {
		e.t.Errorf("rule: a commit on a split not held is Fenced; got %v", err)
	}
	id := spate.MustSplitID(a.heldIDs()[0])
	if err := a.c.Commit(e.ctx, id, spate.NewSplitProgress(10, nil)); err != nil {
		e.t.Fatalf("commit: %v", err)
	}
	if err := a.c.Commit(e.ctx, id, spate.NewSplitProgress(10, nil)); err != nil {
		e.t.Errorf("rule: re-committing the same progress is idempotent; got %v", err)
	}
	err := a.c.Commit(e.ctx, id, spate.NewSplitProgress(9, nil))
	if !spate.IsFatal(err) || !strings.Contains(err.Error(), "watermark") {
		e.t.Errorf("rule: a watermark regression is Fatal; got %v", err)
	}
	if err := a.c.Commit(e.ctx, id, spate.NewSplitProgress(11, nil)); !spate.IsFatal(err) {
		e.t.Errorf("rule: a Fatal commit stops the coordinator; a later commit returned %v", err)
	}
	if len(a.losses) > 0 {
		e.t.Errorf("rule: a commit on a split not held emits no Lost; got %v", a.losses)
	}
}

// scenDepart: a worker that departs keeps, renews and can finish what it
// holds; it is revoked nothing and claims nothing more, so what it hands
// back goes to its peers.
func scenDepart(e *env) {
	f := newFleet(e, planOf("depart", 4))
	a := f.start("a", withPerTick(0))
	b := f.start("b", withPerTick(0))
	f.until(10*leases(f), "a 2/2 split", func() bool { return len(a.held) == 2 && len(b.held) == 2 })
	// The placement may have revoked splits from a (b started late); only
	// what happens after the departure counts.
	revokes, losses := len(a.revokes), len(a.losses)
	if err := a.c.Depart(e.ctx); err != nil {
		e.t.Fatalf("depart: %v", err)
	}
	f.hold(2*leases(f), "a keeping its splits", func() bool { return len(a.held) == 2 })
	if len(a.revokes) > revokes || len(a.losses) > losses {
		e.t.Errorf("rule: a departing worker's held splits are not revoked; after departing a saw revocations %v, losses %v", a.revokes[revokes:], a.losses[losses:])
	}
	ids := a.heldIDs()
	if err := a.c.Release(e.ctx, spate.MustSplitID(ids[0])); err != nil {
		e.t.Fatalf("release: %v", err)
	}
	delete(a.held, ids[0])
	gains := len(a.gains)
	f.until(5*leases(f), "b taking the handed-back split", func() bool { _, ok := b.held[ids[0]]; return ok })
	a.perTick = 5
	f.until(10*leases(f), "a finishing what it kept", func() bool { return len(a.held) == 0 })
	if len(a.gains) != gains {
		e.t.Errorf("rule: a departed worker claims nothing more; it gained %v", a.gains[gains:])
	}
	b.perTick = 5
	f.until(20*leases(f), "AllComplete", func() bool { return b.saw(isAllComplete) })
	f.checkCommitHistory()
}

// countingPlanner counts its runs.
type countingPlanner struct {
	*staticPlanner
	mu   sync.Mutex
	runs int
}

func (p *countingPlanner) Plan(ctx context.Context, pc spate.PlanContext) (spate.SplitPlan, error) {
	p.mu.Lock()
	p.runs++
	p.mu.Unlock()
	return p.staticPlanner.Plan(ctx, pc)
}

// scenFinalNotReplanned: once a plan is final, later leaders do not run the
// planner again (it could only grow a plan that must not grow).
func scenFinalNotReplanned(e *env) {
	p := &countingPlanner{staticPlanner: planOf("finalonce", 2)}
	f := newFleet(e, p)
	a := f.start("a", withPerTick(0))
	f.until(10*leases(f), "a holding the splits", func() bool { return len(a.held) == 2 })
	b := f.start("b", withPerTick(0))
	raw := e.open()
	f.until(5*leases(f), "b joined", func() bool { return len(inspect(e, raw).Members) == 2 })
	a.kill()
	f.until(10*leases(f), "b leading", func() bool {
		js := inspect(e, raw)
		return js.Leader != nil && js.Leader.Instance == "b" && js.Plan.Generation >= 2
	})
	f.until(10*leases(f), "b taking over", func() bool { return len(b.held) == 2 })
	p.mu.Lock()
	runs := p.runs
	p.mu.Unlock()
	if runs != 1 {
		e.t.Errorf("rule: a final plan is not re-run by a new leader; the planner ran %d times", runs)
	}
}
