package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/promtest"
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
	// The hint flushes the owning runner (releasing the held acks) and the
	// chase commits them at the fast cadence.
	waitFor(t, "the chased commit", committedAtLeast(h.src, 0, 20))
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	i := h.log.indexAfter("commit-ready-delivered", 0)
	require.GreaterOrEqual(t, i, 0, "the hint must flush the owning runner")
	require.GreaterOrEqual(t, h.log.indexAfter("flush", i), 0, "the hint must flush the owning runner")
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
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	require.Equal(t, []pipeline.Watermark{wm(1, 10)}, r.FinalWatermarks, "final %v: a retired partition leaves the report", r.FinalWatermarks)
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
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	o, _ := h.src.committed(0)
	require.Equal(t, int64(20), o, "the defensive revoke must commit the old lanes: %d", o)
	require.Equal(t, []pipeline.Watermark{wm(1, 510)}, r.FinalWatermarks, "final %v", r.FinalWatermarks)
}

// LanesAdded may not bring back a partition admitted in this epoch.
func TestAddedLanesReusingAPartitionFail(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 1)),
		waitUntil(func() bool { return h.consumed.Load() == 10 }),
		add(laneSpec{id: 1, part: 0, batches: 1}))
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.Equal(t, "checkpoint", r.Failure.Component, "report %+v", r.Failure)
	require.Contains(t, r.Failure.Reason, "reused partition 0", "report %+v", r.Failure)
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
	require.NoError(t, err)
	_, err = pipeline.New(cfg, h.src, chains, pipeline.SinkHooks{}, nil, pipeline.WithRegisterer(reg))
	require.Error(t, err, "a second pipeline on one registry must be refused")
	h.rt = rt
	wait := h.run()
	waitFor(t, "consumption", func() bool { return h.consumed.Load() == 20 })
	// The runners may consume the lanes' records before the controller
	// goroutine, which handed them out, publishes the assignment's
	// gauges: wait for the gauges, do not sample them once.
	waitFor(t, "lanes_active 2 and state running", func() bool {
		lanes, ok1, err1 := promtest.Value(reg, "spate_source_lanes_active", "component", "source")
		running, ok2, err2 := promtest.Value(reg, "spate_pipeline_state", "state", "running")
		require.NoError(t, errors.Join(err1, err2))
		return ok1 && ok2 && lanes == 2 && running == 1
	})
	v := gathered(t, reg, "spate_pipeline_threads", "component", "pipeline")
	require.Equal(t, float64(4), v, "threads %v", v)
	h.rt.Stop()
	wait()
	v = gathered(t, reg, "spate_pipeline_state", "state", "draining")
	require.Equal(t, float64(1), v, "state draining = %v after a stop", v)
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
			require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
			require.Equal(t, "source", r.Failure.Component, "report %+v", r.Failure)
			require.Contains(t, r.Failure.Reason, tc.want, "report %+v", r.Failure)
			require.True(t, h.drained.Load(), "a failed run still drains the sink")
			if tc.name == "open" {
				require.Zero(t, h.src.stopReading.Load(), "a source that never opened has nothing to hand back")
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
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
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
	require.Equal(t, int64(1), r.UnresolvedAcks, "unresolved = %d, want the one leaked reference", r.UnresolvedAcks)
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.Contains(t, r.Failure.Reason, "unacknowledged", "report %+v", r.Failure)
	o, _ := h.src.committed(0)
	require.Equal(t, int64(10), o, "committed %d: the watermark must stop in front of the leaked batch (10)", o)
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
	require.Equal(t, pipeline.Stopped, r.State, "report %+v", r)
	require.Equal(t, []pipeline.Watermark{wm(0, 20)}, r.FinalWatermarks, "report %+v", r)
	require.True(t, h.drained.Load(), "report %+v", r)
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
	require.NoError(t, err)
	_, err = rt.Run(context.Background())
	require.NoError(t, err)
	v := gathered(t, reg, "spate_source_lag_records", "partition", "3")
	require.Equal(t, float64(42), v, "lag %v", v)
}
