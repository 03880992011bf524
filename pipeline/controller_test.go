package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// A CommitReady hint commits the finishing partition without waiting for
// the (here one-minute) commit tick.
func TestCommitReadyChasesTheFinalCommit(t *testing.T) {
	cfg := testConfig()
	cfg.CommitInterval = time.Minute
	cfg.IdleFlush = time.Minute
	h := &harness{}
	h = newHarness(t, cfg, modeHoldUntilFlush, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.consumed.Load() == 20 }),
		commitReady(0))
	wait := h.run()
	// The hint flushes the owning driver (releasing the held acks) and the
	// chase commits them at the fast cadence.
	waitFor(t, "the chased commit", committedAtLeast(h.src, 0, 20))
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	i := h.log.indexAfter("commit-ready-delivered", 0)
	if i < 0 || h.log.indexAfter("flush", i) < 0 {
		t.Fatal("the hint must flush the owning driver")
	}
}

// Retired lanes leave without a barrier, flush or commit, and their
// partition leaves the exit report.
func TestRetiredLanesLeaveQuietly(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 1), lane(1, 1, 1)),
		waitUntil(func() bool { return committedAtLeast(h.src, 0, 10)() && committedAtLeast(h.src, 1, 10)() }),
		retire(0))
	wait := h.run()
	waitFor(t, "the retirement", func() bool { return h.log.indexAfter("retire-delivered", 0) >= 0 })
	h.rt.Stop()
	r := wait()
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if len(r.FinalWatermarks) != 1 || r.FinalWatermarks[0] != wm(1, 10) {
		t.Fatalf("final %v: a retired partition leaves the report", r.FinalWatermarks)
	}
}

// An assignment that arrives while lanes are live revokes them first
// (draining and committing) and starts a new epoch.
func TestAssignmentWhileLiveRevokesFirst(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.consumed.Load() == 20 }),
		assign(laneSpec{id: 1, part: 1, batches: 1, first: 500}))
	wait := h.run()
	waitFor(t, "the second assignment's data", committedAtLeast(h.src, 1, 510))
	h.rt.Stop()
	r := wait()
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if o, _ := h.src.committed(0); o != 20 {
		t.Fatalf("the defensive revoke must commit the old lanes: %d", o)
	}
	if len(r.FinalWatermarks) != 1 || r.FinalWatermarks[0] != wm(1, 510) {
		t.Fatalf("final %v", r.FinalWatermarks)
	}
}

// LanesAdded may not bring back a partition admitted in this epoch.
func TestAddedLanesReusingAPartitionFail(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 1)),
		waitUntil(func() bool { return h.consumed.Load() == 10 }),
		add(laneSpec{id: 1, part: 0, batches: 1}))
	r := h.run()()
	if r.State != pipeline.Failed || r.Failure.Component != "checkpoint" || !strings.Contains(r.Failure.Reason, "reused partition 0") {
		t.Fatalf("report %+v", r.Failure)
	}
}

// The controller publishes lanes_active and the pipeline state; a second
// pipeline on the same registry is refused at New.
func TestMetricsAreOwnedAndRegisteredOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := &harness{t: t, log: &eventLog{}}
	h.src = newFakeSource(h.log, assign(lane(0, 0, 1), lane(1, 1, 1)))
	chains := func(int) pipeline.Chain {
		return &fakeChain{mode: modeOK, log: h.log, consumed: &h.consumed, flushes: &h.flushes, held: &h.held}
	}
	cfg := testConfig()
	cfg.Threads = 4
	rt, err := pipeline.New(cfg, h.src, chains, pipeline.SinkHooks{}, nil, pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.New(cfg, h.src, chains, pipeline.SinkHooks{}, nil, pipeline.WithRegisterer(reg)); err == nil {
		t.Fatal("a second pipeline on one registry must be refused")
	}
	h.rt = rt
	wait := h.run()
	waitFor(t, "consumption", func() bool { return h.consumed.Load() == 20 })
	if v := gathered(t, reg, "spate_source_lanes_active", "component", "source"); v != 2 {
		t.Fatalf("lanes_active %v", v)
	}
	if v := gathered(t, reg, "spate_pipeline_state", "state", "running"); v != 1 {
		t.Fatalf("state running = %v", v)
	}
	if v := gathered(t, reg, "spate_pipeline_threads", "component", "pipeline"); v != 4 {
		t.Fatalf("threads %v", v)
	}
	h.rt.Stop()
	wait()
	if v := gathered(t, reg, "spate_pipeline_state", "state", "draining"); v != 1 {
		t.Fatalf("state draining = %v after a stop", v)
	}
}

var _ = context.Background

func TestSourceErrorsFailTheRun(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		set        func(*fakeSource)
	}{
		{"open", "source open failed", func(s *fakeSource) { s.openErr = spate.Fatalf("no credentials") }},
		{"poll", "poll_events failed", func(s *fakeSource) { s.pollErr = spate.Fatalf("client closed") }},
		{"commit", "commit failed fatally", func(s *fakeSource) { s.commitErr = spate.Fatalf("watermark regressed") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 1)))
			tc.set(h.src)
			r := h.run()()
			if r.State != pipeline.Failed || r.Failure.Component != "source" || !strings.Contains(r.Failure.Reason, tc.want) {
				t.Fatalf("report %+v", r.Failure)
			}
			if !h.drained.Load() {
				t.Fatal("a failed run still drains the sink")
			}
			if tc.name == "open" && h.src.stopReading.Load() != 0 {
				t.Fatal("a source that never opened has nothing to hand back")
			}
		})
	}
}

// A retryable source error is logged and tolerated.
func TestRetryableSourceErrorsAreTolerated(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0)
	h.src.pollErr = spate.Retryablef("broker hiccup")
	wait := h.run()
	waitFor(t, "passes that fail retryably", func() bool { return h.src.polls.Load() >= 10 })
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
}

// A reference that is never released is detectable: the exit report
// counts it, and the watermark stalls in front of the leaked batch (the
// safe direction), so a Drained exit fails instead of claiming completion.
func TestLeakedAckIsDetected(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeLeakAt, 2,
		assign(lane(0, 0, 3)),
		waitUntil(func() bool { return h.consumed.Load() == 30 }),
		drained())
	done := make(chan pipeline.ExitReport, 1)
	go func() { r, _ := h.rt.Run(context.Background()); done <- r }()
	r := <-done
	if r.UnresolvedAcks != 1 {
		t.Fatalf("unresolved = %d, want the one leaked reference", r.UnresolvedAcks)
	}
	if r.State != pipeline.Failed || !strings.Contains(r.Failure.Reason, "unacknowledged") {
		t.Fatalf("report %+v", r.Failure)
	}
	if o, _ := h.src.committed(0); o != 10 {
		t.Fatalf("committed %d: the watermark must stop in front of the leaked batch (10)", o)
	}
}

// Cancelling Run's context is a graceful drain.
func TestContextCancellationDrains(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 2)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan pipeline.ExitReport, 1)
	go func() { r, _ := h.rt.Run(ctx); done <- r }()
	waitFor(t, "consumption", func() bool { return h.consumed.Load() == 20 })
	cancel()
	r := <-done
	if r.State != pipeline.Stopped || len(r.FinalWatermarks) != 1 || r.FinalWatermarks[0] != wm(0, 20) || !h.drained.Load() {
		t.Fatalf("report %+v", r)
	}
}

// The lag a source publishes through its context appears in the
// exposition under the controller's series.
type lagSource struct{ *fakeSource }

func (s lagSource) Open(ctx pipeline.SourceCtx) error {
	ctx.Metrics.SetLag(3, 42)
	return s.fakeSource.Open(ctx)
}

func TestSourcePublishesLag(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := &harness{t: t, log: &eventLog{}}
	h.src = newFakeSource(h.log, drained())
	rt, err := pipeline.New(testConfig(), lagSource{h.src}, func(int) pipeline.Chain {
		return &fakeChain{log: h.log, consumed: &h.consumed, flushes: &h.flushes, held: &h.held}
	}, pipeline.SinkHooks{}, nil, pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := gathered(t, reg, "spate_source_lag_records", "partition", "3"); v != 42 {
		t.Fatalf("lag %v", v)
	}
}
