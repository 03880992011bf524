package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

func committedAtLeast(src *fakeSource, p, want int) func() bool {
	return func() bool {
		o, ok := src.committed(pipeline.PartitionID(p))
		return ok && o >= int64(want)
	}
}

// ★1
func TestHappyPathCommitsAndCompletes(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 3)))
	wait := h.run()
	waitFor(t, "30 records consumed", func() bool { return h.consumed.Load() == 30 })
	waitFor(t, "watermark 30 committed", committedAtLeast(h.src, 0, 30))
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v (%v), want Completed", r.State, r.Failure)
	require.Equal(t, []pipeline.Watermark{wm(0, 30)}, r.FinalWatermarks, "final watermarks %v, want [{0 30}]", r.FinalWatermarks)
	require.True(t, h.drained.Load(), "the sink drain did not run")
	require.NotNil(t, r.SinkDrain, "the sink drain did not run")
	require.True(t, h.src.opened.Load(), "open=%v flush_commits=%d", h.src.opened.Load(), h.src.flushCommits.Load())
	require.GreaterOrEqual(t, h.src.flushCommits.Load(), int32(1), "open=%v flush_commits=%d", h.src.opened.Load(), h.src.flushCommits.Load())
}

// 2
func TestCommitTickFlushesChainsWithoutAnIdleLull(t *testing.T) {
	cfg := testConfig()
	cfg.IdleFlush = 60 * time.Second
	h := newHarness(t, cfg, modeOK, 0, assign(lane(0, 0, 3)))
	wait := h.run()
	waitFor(t, "consumption", func() bool { return h.consumed.Load() == 30 })
	base := h.flushes.Load()
	waitFor(t, "three flushes from the commit tick", func() bool { return h.flushes.Load() >= base+3 })
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
}

// ★3
func TestRevocationDrainsFlushesAndCommits(t *testing.T) {
	h := &harness{}
	var consumedAtRevoke int64
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { consumedAtRevoke = h.consumed.Load(); return consumedAtRevoke == 20 }),
		revoke(0))
	wait := h.run()
	waitFor(t, "revoke delivered", func() bool { return h.log.indexAfter("revoke-delivered", 0) >= 0 })
	waitFor(t, "commit after the revoke", func() bool {
		i := h.log.indexAfter("revoke-delivered", 0)
		return h.log.indexAfter("commit", i) > 0 && h.log.indexAfter("flush", i) > 0
	})
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	got := h.consumed.Load()
	require.Equal(t, consumedAtRevoke, got, "consumed %d after the revoke, %d at it", got, consumedAtRevoke)
	o, _ := h.src.committed(0)
	require.Equal(t, consumedAtRevoke, o, "committed %d, want %d", o, consumedAtRevoke)
}

// ★4
func TestRevocationFlushesParkedAcksBeforeCommitting(t *testing.T) {
	cfg := testConfig()
	cfg.CommitInterval = 60 * time.Second
	cfg.IdleFlush = 60 * time.Second
	h := &harness{}
	h = newHarness(t, cfg, modeHoldUntilFlush, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.consumed.Load() == 20 }),
		revoke(0))
	wait := h.run()
	waitFor(t, "revoke delivered", func() bool { return h.log.indexAfter("revoke-delivered", 0) >= 0 })
	before := h.log.indexAfter("revoke-delivered", 0)
	if i := h.log.indexAfter("commit", 0); i >= 0 {
		require.GreaterOrEqual(t, i, before, "something committed before the revoke")
	}
	waitFor(t, "the revoke's commit", committedAtLeast(h.src, 0, 20))
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	o, _ := h.src.committed(0)
	require.Equal(t, int64(20), o, "committed %d, want 20", o)
}

// ★5
func TestBlockedChainPausesThenResumes(t *testing.T) {
	h := newHarness(t, testConfig(), modeBlockOnce, 0, assign(lane(0, 0, 2)))
	wait := h.run()
	waitFor(t, "all 20 records", func() bool { return h.consumed.Load() == 20 })
	waitFor(t, "pause then resume", func() bool {
		h.src.mu.Lock()
		defer h.src.mu.Unlock()
		return len(h.src.pauses) >= 1 && len(h.src.resumes) >= 1
	})
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	h.src.mu.Lock()
	defer h.src.mu.Unlock()
	require.Equal(t, []pipeline.LaneID{0}, h.src.pauses[0], "pauses %v resumes %v, want [[0]] each", h.src.pauses, h.src.resumes)
	require.Equal(t, []pipeline.LaneID{0}, h.src.resumes[0], "pauses %v resumes %v, want [[0]] each", h.src.pauses, h.src.resumes)
}

// ★6
func TestShutdownDuringPermanentlyBlockedBatch(t *testing.T) {
	h := newHarness(t, testConfig(), modeBlockForever, 0, assign(lane(0, 0, 1)))
	wait := h.run()
	waitFor(t, "the pause a blocked batch causes", func() bool { return h.src.pauseCount() > 0 })
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v consumed %d", r.State, h.consumed.Load())
	require.Zero(t, h.consumed.Load(), "state %v consumed %d", r.State, h.consumed.Load())
	_, ok := h.src.committed(0)
	require.False(t, ok, "an abandoned batch was committed")
}

// ★7
func TestFatalChainFailsPipelineAndStallsWatermark(t *testing.T) {
	h := newHarness(t, testConfig(), modeFatalAt, 2, assign(lane(0, 0, 3)))
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v, want Failed by fake-chain", r)
	require.Equal(t, "fake-chain", r.Failure.Component, "report %+v, want Failed by fake-chain", r)
	if o, ok := h.src.committed(0); ok {
		require.LessOrEqual(t, o, int64(10), "committed %d, past the failed batch", o)
	}
	require.True(t, h.drained.Load(), "the sink drain did not run")
}

// ★8
func TestChainPanicFailsPipeline(t *testing.T) {
	h := newHarness(t, testConfig(), modePanicAt, 2, assign(lane(0, 0, 3)))
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v, want a panicked failure", r)
	require.Contains(t, r.Failure.Reason, "panicked", "report %+v, want a panicked failure", r)
	if o, ok := h.src.committed(0); ok {
		require.LessOrEqual(t, o, int64(10), "committed %d past the panicked batch", o)
	}
}

// ★9
func TestPermanentWatermarkStallFailsPipeline(t *testing.T) {
	cfg := testConfig()
	cfg.StalledFailAfter = 50 * time.Millisecond
	h := newHarness(t, cfg, modeFailAckAt, 1, assign(lane(0, 0, 3)))
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v, want a checkpoint stall", r.Failure)
	require.Equal(t, "checkpoint", r.Failure.Component, "report %+v, want a checkpoint stall", r.Failure)
	require.Contains(t, r.Failure.Reason, "stalled", "report %+v, want a checkpoint stall", r.Failure)
}

// ★10
func TestPendingCeilingIsAHardBound(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPendingBatches = 3
	h := newHarness(t, cfg, modeHoldAcks, 0, assign(lane(0, 0, 6)))
	wait := h.run()
	waitFor(t, "three held batches", func() bool { return h.held.count() == 3 })
	// Many ticks and passes later, still three: the gate is checked before
	// every poll.
	deadline := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(deadline) {
		n := h.held.count()
		require.Equal(t, 3, n, "%d batches entered the chain past a ceiling of 3", n)
		time.Sleep(5 * time.Millisecond)
	}
	require.Zero(t, h.src.pauseCount(), "the ceiling paused the source")
	for h.consumed.Load() < 60 {
		h.held.releaseAll()
		time.Sleep(time.Millisecond)
	}
	h.held.releaseAll()
	waitFor(t, "everything committed", committedAtLeast(h.src, 0, 60))
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
}

// 11
func TestStalledPartitionPlateausAtTheCeiling(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPendingBatches = 3
	h := newHarness(t, cfg, modeFailAckAt, 1, assign(lane(0, 0, 10)))
	wait := h.run()
	waitFor(t, "30 records", func() bool { return h.consumed.Load() == 30 })
	time.Sleep(200 * time.Millisecond) // many passes: the plateau must hold
	n := h.consumed.Load()
	require.Equal(t, int64(30), n, "consumed %d past the plateau of 30", n)
	h.rt.Stop()
	wait()
}

// 12
func TestCeilingGatesOnlyItsOwnPartition(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPendingBatches = 3
	h := &harness{}
	h = newHarness(t, cfg, modeHoldAcks, 0,
		assign(lane(0, 0, 6)),
		waitUntil(func() bool { return h.held.count() == 3 }),
		add(laneSpec{id: 1, part: 1, batches: 1, first: 100}))
	wait := h.run()
	waitFor(t, "the added partition's batch", func() bool { return h.held.count() == 4 })
	require.Zero(t, h.src.pauseCount(), "the ceiling paused the source")
	for h.consumed.Load() < 70 {
		h.held.releaseAll()
		time.Sleep(time.Millisecond)
	}
	h.held.releaseAll()
	waitFor(t, "both partitions committed", func() bool {
		return committedAtLeast(h.src, 0, 60)() && committedAtLeast(h.src, 1, 110)()
	})
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
}

// ★13
func TestShutdownFlushesTheChainBeforeExit(t *testing.T) {
	cfg := testConfig()
	cfg.CommitInterval = 60 * time.Second
	cfg.IdleFlush = 60 * time.Second
	h := newHarness(t, cfg, modeHoldUntilFlush, 0, assign(laneSpec{id: 0, part: 0, batches: 1, size: 5}))
	wait := h.run()
	waitFor(t, "five records", func() bool { return h.consumed.Load() == 5 })
	before := h.flushes.Load()
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v flushes %d -> %d", r.State, before, h.flushes.Load())
	require.Greater(t, h.flushes.Load(), before, "state %v flushes %d -> %d", r.State, before, h.flushes.Load())
	require.Equal(t, []pipeline.Watermark{wm(0, 5)}, r.FinalWatermarks, "final %v drained %v", r.FinalWatermarks, h.drained.Load())
	require.True(t, h.drained.Load(), "final %v drained %v", r.FinalWatermarks, h.drained.Load())
}

// ★14
func TestDrainedSourceCompletesOnItsOwn(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 3)),
		waitUntil(func() bool { return h.consumed.Load() == 30 }),
		drained())
	r := h.run()()
	require.Equal(t, pipeline.Completed, r.State, "report %+v", r)
	require.Equal(t, []pipeline.Watermark{wm(0, 30)}, r.FinalWatermarks, "report %+v", r)
	require.True(t, h.drained.Load(), "sink drain or final flush missing")
	require.GreaterOrEqual(t, h.src.flushCommits.Load(), int32(1), "sink drain or final flush missing")
	require.Zero(t, h.src.stopReading.Load(), "a Drained exit has nothing to hand back")
}

// 15
func TestDrainedBeforeAnyData(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, drained())
	r := h.run()()
	require.Equal(t, pipeline.Completed, r.State, "report %+v", r)
	require.Empty(t, r.FinalWatermarks, "report %+v", r)
	require.True(t, h.drained.Load(), "report %+v", r)
}

// ★16
func TestDrainedWithUnacknowledgedBatchesFails(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeHoldAcks, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.held.count() == 2 }),
		drained())
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.Equal(t, "source", r.Failure.Component, "report %+v", r.Failure)
	require.Contains(t, r.Failure.Reason, "unacknowledged", "report %+v", r.Failure)
	require.Empty(t, r.FinalWatermarks, "final watermarks %v", r.FinalWatermarks)
}

// ★17
func TestDrainedWhileCommitsFailRetryably(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.consumed.Load() == 20 }),
		drained())
	h.src.failCommits.Store(true)
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.Equal(t, "source", r.Failure.Component, "report %+v", r.Failure)
	require.Contains(t, r.Failure.Reason, "did not persist", "report %+v", r.Failure)
	require.Empty(t, r.FinalWatermarks, "final watermarks %v", r.FinalWatermarks)
}

// ★19
func TestControllerPanicFailsTheRun(t *testing.T) {
	h := newHarness(t, testConfig(), modeBlockForever, 0,
		assign(lane(0, 0, 1)), step{kind: stepPanic})
	r := h.run()()
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.Equal(t, "controller", r.Failure.Component, "report %+v", r.Failure)
	require.Equal(t, "controller thread panicked: scripted source panic", r.Failure.Reason)
}

// A runtime runs once: a second Run fails at once and names the misuse.
func TestRunTwiceFailsTheSecond(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 1)))
	wait := h.run()
	waitFor(t, "10 records consumed", func() bool { return h.consumed.Load() == 10 })
	r, err := h.rt.Run(context.Background())
	require.EqualError(t, err, "pipeline: Run called twice")
	require.Equal(t, pipeline.Failed, r.State)
	h.rt.Stop()
	require.Equal(t, pipeline.Stopped, wait().State, "the second Run disturbed the first")
}

// A graceful stop reads on while the source says so, then hands back.
func TestStopReadsOnUntilTheSourceIsDone(t *testing.T) {
	cfg := testConfig()
	// A stop reads on only until StopReserve before its deadline, never
	// before its trigger: with the default reserve (5s) above the 3s drain
	// timeout it would end its reading at once, and only the runners' lag
	// in seeing the shutdown could read on. Leave it 2s to read on.
	cfg.StopReserve = cfg.DrainTimeout - 2*time.Second
	h := &harness{}
	h = newHarness(t, cfg, modeOK, 0, assign(laneSpec{id: 0, part: 0, forever: true}))
	var stopAt atomic.Int64 // read by the controller goroutine
	stopAt.Store(1 << 62)
	var asked atomic.Int32 // ReadingOnStop calls: the controller asks only while stopping
	h.src.readingOnStop = func() bool {
		asked.Add(1)
		return h.consumed.Load() < stopAt.Load()+100
	}
	wait := h.run()
	waitFor(t, "some data", func() bool { return h.consumed.Load() > 0 })
	atStop := h.consumed.Load()
	stopAt.Store(atStop)
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	require.NotZero(t, asked.Load(), "the stop ended its reading without asking the source")
	require.GreaterOrEqual(t, h.consumed.Load(), atStop+100, "the stop did not read on: %d at the stop, %d at the end", atStop, h.consumed.Load())
	require.Equal(t, int32(1), h.src.stopReading.Load(), "StopReading called %d times, want 1", h.src.stopReading.Load())
	i := h.log.indexAfter("stop_reading", 0)
	require.GreaterOrEqual(t, i, 0, "the hand-back must precede the final commit flush")
	require.GreaterOrEqual(t, h.log.indexAfter("flush_commits", i), 0, "the hand-back must precede the final commit flush")
	require.Len(t, r.FinalWatermarks, 1, "final %v: the reading's data must be committed", r.FinalWatermarks)
	require.GreaterOrEqual(t, r.FinalWatermarks[0].Offset, atStop+100, "final %v: the reading's data must be committed", r.FinalWatermarks)
}

// A revocation wait renews what the source holds and, once a stop must be
// served, sets the runners' flag so a blocked batch is abandoned.
func TestRevocationWaitRenewsAndYieldsToAStop(t *testing.T) {
	cfg := testConfig()
	cfg.DrainTimeout = 20 * time.Second
	h := &harness{}
	h = newHarness(t, cfg, modeBlockForever, 0,
		assign(lane(0, 0, 1)),
		waitUntil(func() bool { return h.src.pauseCount() > 0 }),
		revoke(0))
	wait := h.run()
	waitFor(t, "renewals during the revocation wait", func() bool { return h.src.renewHeld.Load() >= 3 })
	start := time.Now()
	h.rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "state %v: %v", r.State, r.Failure)
	require.LessOrEqual(t, time.Since(start), 15*time.Second, "the revocation wait ignored the stop")
}
