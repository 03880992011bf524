package spate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type funcPlanner struct {
	plan func(ctx context.Context, pc PlanContext) (SplitPlan, error)
}

func (funcPlanner) Fingerprint() string { return testFP }
func (p funcPlanner) Plan(ctx context.Context, pc PlanContext) (SplitPlan, error) {
	return p.plan(ctx, pc)
}

func fixedPlan(plan SplitPlan) funcPlanner {
	return funcPlanner{plan: func(context.Context, PlanContext) (SplitPlan, error) { return plan, nil }}
}

func planned(id string, weight uint64) PlannedSplit {
	return NewPlannedSplit(NewSplitSpec(MustSplitID(id), []byte("d-"+id)).WithWeight(weight))
}

// newPlanRun returns a run over st and the plan record it starts from.
func newPlanRun(t *testing.T, st *fakeStore, p SplitPlanner, snap planRecord) (planRun, planRecord, uint64) {
	t.Helper()
	m, err := newCoordMetrics(nil, nil)
	require.NoError(t, err)
	snap.Schema, snap.Fingerprint = SchemaVersion, testFP
	if snap.Finality == "" {
		snap.Finality = finalityOpen
	}
	rev := st.put(Durable, keyPlan, encode(&snap))
	return planRun{st: st, planner: p, fpHash: testFPHash, m: m}, snap, rev
}

func storedPlan(t *testing.T, st *fakeStore) (*planRecord, uint64) {
	t.Helper()
	e, ok := st.entry(Durable, keyPlan)
	require.True(t, ok)
	p, err := decodePlan(keyPlan, e.Value, testFP)
	require.NoError(t, err)
	return p, e.Revision
}

func TestPlanRunSeedsAndPublishes(t *testing.T) {
	st := newFakeStore()
	var sawCtx PlanContext
	splits := []PlannedSplit{
		planned("a", 5),
		planned("b", 0),
		planned("a", 99), // a duplicate id: the first occurrence wins
		planned("c", 1).WithSeed(SplitProgress{Watermark: 40, State: []byte("cp")}),
		planned("d", 1).WithSeed(CompletedProgress(9, nil)),
	}
	p := funcPlanner{plan: func(_ context.Context, pc PlanContext) (SplitPlan, error) {
		sawCtx = pc
		return NewSplitPlan(splits, PlanFinal).WithPlannerState([]byte("cursor-2")), nil
	}}
	cursor := []byte("cursor-1")
	run, snap, rev := newPlanRun(t, st, p, planRecord{Generation: 6, PlannerState: &cursor})
	res := run.run(context.Background(), snap, rev)

	require.Equal(t, planOK, res.outcome, "%v", res.err)
	assert.Equal(t, PlanContext{PlannerState: []byte("cursor-1"), Generation: 6}, sawCtx)
	assert.Equal(t, 4, res.created)
	assert.Equal(t, 4.0, testutil.ToFloat64(run.m.planned))
	got, gotRev := storedPlan(t, st)
	assert.Equal(t, gotRev, res.rev)
	assert.Equal(t, *got, *res.plan)
	assert.Equal(t, uint64(4), got.Planned)
	assert.Equal(t, finalityFinal, got.Finality)
	assert.Equal(t, uint64(6), got.Generation, "a run never changes the generation")
	require.NotNil(t, got.PlannerState)
	assert.Equal(t, []byte("cursor-2"), *got.PlannerState)

	e, ok := st.entry(Durable, prefixSpec+"a")
	require.True(t, ok)
	spec, err := decodeSpec(e.Key, "a", e.Value, testFPHash)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), spec.Weight, "the first occurrence of a duplicate id wins")
	assert.Equal(t, []byte("d-a"), spec.Descriptor)
	assert.Equal(t, uint64(6), spec.Generation)
	e, _ = st.entry(Durable, prefixSpec+"b")
	spec, _ = decodeSpec(e.Key, "b", e.Value, testFPHash)
	assert.Equal(t, uint64(1), spec.Weight, "weight 0 is stored as 1")

	c, _ := storedProgress(t, st, "c")
	assert.Equal(t, int64(40), *c.Watermark)
	assert.Equal(t, []byte("cp"), c.State)
	assert.Equal(t, statusRunnable, c.Status)
	d, _ := storedProgress(t, st, "d")
	assert.Equal(t, statusCompleted, d.Status)
	a, _ := storedProgress(t, st, "a")
	assert.Nil(t, a.Watermark)
	assert.Zero(t, a.Epoch)
}

// Re-running an unchanged plan creates nothing and reports a no-op; the
// planned count comes from a listing, so records seeded by an earlier run
// that crashed before publishing count too.
func TestPlanRunIsIdempotentAndRecountsFromAListing(t *testing.T) {
	st := newFakeStore()
	st.put(Durable, prefixSplit+"z", encode(newProgressRecord("z", testFPHash, nil))) // an earlier run's seed
	p := fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1), planned("b", 1)}, PlanOpen))
	run, snap, rev := newPlanRun(t, st, p, planRecord{})
	res := run.run(context.Background(), snap, rev)
	require.Equal(t, planOK, res.outcome)
	assert.Equal(t, uint64(3), res.plan.Planned)
	assert.Nil(t, res.plan.PlannerState, "a plan without a cursor keeps the previous (none)")

	again := run.run(context.Background(), *res.plan, res.rev)
	require.Equal(t, planNoop, again.outcome, "%v", again.err)
	assert.Zero(t, again.created)
	assert.Equal(t, uint64(3), again.plan.Planned)
}

// A seed never overwrites an existing progress record.
func TestPlanRunSeedIsFirstWriterWins(t *testing.T) {
	st := newFakeStore()
	existing := rec("a", 3, "w-1")
	existing.Watermark = wm(77)
	st.put(Durable, prefixSplit+"a", encode(existing))
	p := fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1).WithSeed(SplitProgress{Watermark: 1})}, PlanOpen))
	run, snap, rev := newPlanRun(t, st, p, planRecord{})
	res := run.run(context.Background(), snap, rev)
	require.Equal(t, planOK, res.outcome, "the spec was created, so the run is no no-op")
	assert.Zero(t, res.created)
	got, _ := storedProgress(t, st, "a")
	assert.Equal(t, int64(77), *got.Watermark)
	assert.Equal(t, "w-1", got.owner())
}

func TestPlanRunFinalIsSticky(t *testing.T) {
	st := newFakeStore()
	p := fixedPlan(NewSplitPlan(nil, PlanOpen))
	run, snap, rev := newPlanRun(t, st, p, planRecord{Finality: finalityFinal})
	res := run.run(context.Background(), snap, rev)
	require.Equal(t, planNoop, res.outcome)
	assert.Equal(t, finalityFinal, res.plan.Finality, "a later Open run cannot reopen a final plan")
}

func TestPlanRunFailures(t *testing.T) {
	plannerErr := func(err error) funcPlanner {
		return funcPlanner{plan: func(context.Context, PlanContext) (SplitPlan, error) { return SplitPlan{}, err }}
	}
	cases := []struct {
		name    string
		planner SplitPlanner
		fault   func(fakeCall) fakeFault
		want    planOutcome
		wantMsg string
	}{
		{name: "retryable planner error", planner: plannerErr(Retryablef("list timed out")), want: planError},
		{name: "unclassified planner error is Fatal", planner: plannerErr(errors.New("bad config")), want: planFatal, wantMsg: "bad config"},
		{name: "planner panic is Fatal", planner: funcPlanner{plan: func(context.Context, PlanContext) (SplitPlan, error) { panic("kaboom") }},
			want: planFatal, wantMsg: "panicked: kaboom"},
		{name: "a zero split id is Fatal", planner: fixedPlan(NewSplitPlan([]PlannedSplit{{Spec: SplitSpec{Descriptor: []byte{}}}}, PlanOpen)),
			want: planFatal, wantMsg: "zero SplitID"},
		{name: "retryable seeding error", planner: fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1)}, PlanOpen)),
			fault: func(c fakeCall) fakeFault {
				if c.op == "create" {
					return fakeFault{err: Retryablef("down")}
				}
				return fakeFault{}
			}, want: planError},
		{name: "fatal seeding error", planner: fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1), planned("b", 1)}, PlanOpen)),
			fault: func(c fakeCall) fakeFault {
				if c.op == "create" && c.key == prefixSpec+"b" {
					return fakeFault{err: Fatalf("value too large")}
				}
				return fakeFault{}
			}, want: planFatal, wantMsg: "seeding spec b"},
		{name: "listing error", planner: fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1)}, PlanFinal)),
			fault: func(c fakeCall) fakeFault {
				if c.op == "list" {
					return fakeFault{err: Retryablef("down")}
				}
				return fakeFault{}
			}, want: planError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newFakeStore()
			run, snap, rev := newPlanRun(t, st, c.planner, planRecord{})
			st.setFault(c.fault)
			res := run.run(context.Background(), snap, rev)
			assert.Equal(t, c.want, res.outcome, "%v", res.err)
			require.Error(t, res.err)
			if c.wantMsg != "" {
				assert.Contains(t, res.err.Error(), c.wantMsg)
			}
			if c.want == planFatal {
				assert.True(t, IsFatal(res.err))
			}
			p, _ := storedPlan(t, st)
			assert.Equal(t, snap, *p, "a failed run publishes nothing")
		})
	}
}

// A run whose plan compare-and-swap loses (a successor bumped the
// generation) reports planLost.
func TestPlanRunLosesToASuccessor(t *testing.T) {
	st := newFakeStore()
	run, snap, rev := newPlanRun(t, st, fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1)}, PlanOpen)), planRecord{Generation: 1})
	next := snap
	next.Generation = 2
	st.put(Durable, keyPlan, encode(&next))
	res := run.run(context.Background(), snap, rev)
	assert.Equal(t, planLost, res.outcome)
	assert.Equal(t, 1, res.created, "the seeds landed; they are create-if-absent, so the successor finds them harmlessly")
	p, _ := storedPlan(t, st)
	assert.Equal(t, uint64(2), p.Generation)
}

// A cancelled run (leadership lost) stops seeding and reports a retryable
// error, without publishing.
func TestPlanRunCancelled(t *testing.T) {
	st := newFakeStore()
	ctx, cancel := context.WithCancel(context.Background())
	p := funcPlanner{plan: func(context.Context, PlanContext) (SplitPlan, error) {
		cancel()
		return NewSplitPlan([]PlannedSplit{planned("a", 1), planned("b", 1)}, PlanFinal), nil
	}}
	run, snap, rev := newPlanRun(t, st, p, planRecord{})
	res := run.run(ctx, snap, rev)
	assert.Equal(t, planError, res.outcome)
	assert.True(t, IsRetryable(res.err), "%v", res.err)
	assert.Zero(t, st.count("create", ""))
	pl, _ := storedPlan(t, st)
	assert.Equal(t, finalityOpen, pl.Finality)
}

// ----- on the loop -------------------------------------------------------------------

func TestFinishPlan(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.planning.plan, a.planning.planRev = &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen}, 3
	a.planning.running = true

	require.NoError(t, a.finishPlan(planResult{outcome: planError, err: Retryablef("x")}))
	assert.False(t, a.planning.running)
	assert.Equal(t, finalityOpen, a.planning.plan.Finality)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.replans.WithLabelValues("error")))

	final := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 5}
	require.NoError(t, a.finishPlan(planResult{outcome: planOK, plan: final, rev: 9}))
	assert.Same(t, final, a.planning.plan)
	assert.True(t, a.dirty)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.replans.WithLabelValues("ok")))

	a.leader.term = &leadership{generation: 1}
	require.NoError(t, a.finishPlan(planResult{outcome: planLost}))
	assert.Nil(t, a.leader.term, "a successor bumped the generation: demoted")

	fatal := Fatalf("planner: bad")
	assert.Same(t, fatal, a.finishPlan(planResult{outcome: planFatal, err: fatal}))
}

// startPlan runs the planner off the loop and hands the result back
// through planning.done.
func TestStartPlanRunsOffTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		a.planner = fixedPlan(NewSplitPlan([]PlannedSplit{planned("a", 1)}, PlanFinal))
		p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen}
		a.planning.plan, a.planning.planRev = p, st.put(Durable, keyPlan, encode(p))
		a.startPlan()
		assert.False(t, a.planning.running, "nothing due: nothing runs")
		a.planning.due = true
		a.startPlan()
		require.True(t, a.planning.running)
		a.startPlan() // one run at a time
		res := <-a.planning.done
		require.NoError(t, a.finishPlan(res))
		assert.Equal(t, finalityFinal, a.planning.plan.Finality)
		assert.Equal(t, uint64(1), a.planning.plan.Planned)
		assert.Equal(t, 1, st.count("update", keyPlan), "exactly one run")
	})
}

// A replan of an open plan writes what is new: the splits the leader's
// view holds are not seeded again, and a run with nothing to seed, under
// a count the view agrees with, lists nothing; the plan record is the one
// other write.
func TestPlanRunWritesOnlyWhatIsNew(t *testing.T) {
	st := newFakeStore()
	var splits []PlannedSplit
	for i := range 100 {
		splits = append(splits, planned(fmt.Sprintf("s%03d", i), 1))
	}
	run, snap, rev := newPlanRun(t, st, fixedPlan(NewSplitPlan(splits, PlanOpen)), planRecord{})
	res := run.run(context.Background(), snap, rev)
	require.Equal(t, planOK, res.outcome, "%v", res.err)
	require.Equal(t, 100, res.created)

	// The run seeds on several goroutines at once, and the fake calls its
	// fault hook outside its own lock.
	var mu sync.Mutex
	calls := map[string]int{}
	st.setFault(func(c fakeCall) fakeFault { mu.Lock(); calls[c.op]++; mu.Unlock(); return fakeFault{} })
	run.known = map[string]struct{}{}
	for _, s := range splits {
		run.known[s.Spec.ID.String()] = struct{}{}
	}
	grown := append(slices.Clone(splits), planned("new-1", 1), planned("new-2", 1))
	run.planner = fixedPlan(NewSplitPlan(grown, PlanOpen))
	res = run.run(context.Background(), *res.plan, res.rev)
	require.Equal(t, planOK, res.outcome, "%v", res.err)
	assert.Equal(t, 2, res.created)
	assert.Equal(t, uint64(102), res.plan.Planned)
	assert.Equal(t, 4, calls["create"], "two new splits: a spec and a progress record each")
	assert.Equal(t, 1, calls["update"], "one plan record")

	clear(calls)
	run.known["new-1"], run.known["new-2"] = struct{}{}, struct{}{}
	res = run.run(context.Background(), *res.plan, res.rev)
	require.Equal(t, planNoop, res.outcome, "%v", res.err)
	assert.Equal(t, uint64(102), res.plan.Planned)
	assert.Zero(t, calls["create"])
	assert.Zero(t, calls["list"], "nothing new: no listing of the job")
}

// Close waits for a planner run that ignores its cancellation at most the
// timeout, and says so when it leaves the run behind; a run that returns,
// or none in flight, costs no wait.
func TestPlanningWaitIsBoundedByTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logged bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logged, nil))

		idle := planning{done: make(chan planResult, 1)}
		start := time.Now()
		idle.wait(time.Minute, log)
		assert.Zero(t, time.Since(start), "no run in flight: no wait")

		returned := planning{running: true, done: make(chan planResult, 1)}
		go func() {
			time.Sleep(time.Second)
			returned.done <- planResult{}
		}()
		start = time.Now()
		returned.wait(time.Minute, log)
		assert.Equal(t, time.Second, time.Since(start), "a run that returns ends the wait")
		assert.Empty(t, logged.String())

		stuck := planning{running: true, done: make(chan planResult, 1)}
		start = time.Now()
		stuck.wait(time.Minute, log)
		assert.Equal(t, time.Minute, time.Since(start), "a run that never returns is left behind at the timeout")
		assert.Contains(t, logged.String(), "leaving it behind")
	})
}

// TestZeroWeightBalancesAsOne moved from spate_test.go's
// TestBuildersCoverTheSeamTypes when effectiveWeight left the API.
func TestZeroWeightBalancesAsOne(t *testing.T) {
	spec := NewSplitSpec(MustSplitID("s"), []byte("d"))
	w := spec.WithWeight(0).effectiveWeight()
	assert.Equal(t, uint64(1), w, "weight 0 is treated as 1, got %d", w)
}
