package pipeline_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

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
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v (%v), want Completed", r.State, r.Failure)
	}
	if !slices.Equal(r.FinalWatermarks, []pipeline.Watermark{wm(0, 30)}) {
		t.Fatalf("final watermarks %v, want [{0 30}]", r.FinalWatermarks)
	}
	if !h.drained.Load() || r.SinkDrain == nil {
		t.Fatal("the sink drain did not run")
	}
	if !h.src.opened.Load() || h.src.flushCommits.Load() < 1 {
		t.Fatalf("open=%v flush_commits=%d", h.src.opened.Load(), h.src.flushCommits.Load())
	}
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
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
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
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if got := h.consumed.Load(); got != consumedAtRevoke {
		t.Fatalf("consumed %d after the revoke, %d at it", got, consumedAtRevoke)
	}
	if o, _ := h.src.committed(0); o != consumedAtRevoke {
		t.Fatalf("committed %d, want %d", o, consumedAtRevoke)
	}
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
	if i := h.log.indexAfter("commit", 0); i >= 0 && i < before {
		t.Fatal("something committed before the revoke")
	}
	waitFor(t, "the revoke's commit", committedAtLeast(h.src, 0, 20))
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if o, _ := h.src.committed(0); o != 20 {
		t.Fatalf("committed %d, want 20", o)
	}
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
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	h.src.mu.Lock()
	defer h.src.mu.Unlock()
	if !slices.Equal(h.src.pauses[0], []pipeline.LaneID{0}) || !slices.Equal(h.src.resumes[0], []pipeline.LaneID{0}) {
		t.Fatalf("pauses %v resumes %v, want [[0]] each", h.src.pauses, h.src.resumes)
	}
}

// ★6
func TestShutdownDuringPermanentlyBlockedBatch(t *testing.T) {
	h := newHarness(t, testConfig(), modeBlockForever, 0, assign(lane(0, 0, 1)))
	wait := h.run()
	waitFor(t, "the pause a blocked batch causes", func() bool { return h.src.pauseCount() > 0 })
	h.rt.Stop()
	r := wait()
	if r.State != pipeline.Stopped || h.consumed.Load() != 0 {
		t.Fatalf("state %v consumed %d", r.State, h.consumed.Load())
	}
	if _, ok := h.src.committed(0); ok {
		t.Fatal("an abandoned batch was committed")
	}
}

// ★7
func TestFatalChainFailsPipelineAndStallsWatermark(t *testing.T) {
	h := newHarness(t, testConfig(), modeFatalAt, 2, assign(lane(0, 0, 3)))
	r := h.run()()
	if r.State != pipeline.Failed || r.Failure.Component != "fake-chain" {
		t.Fatalf("report %+v, want Failed by fake-chain", r)
	}
	if o, ok := h.src.committed(0); ok && o > 10 {
		t.Fatalf("committed %d, past the failed batch", o)
	}
	if !h.drained.Load() {
		t.Fatal("the sink drain did not run")
	}
}

// ★8
func TestChainPanicFailsPipeline(t *testing.T) {
	h := newHarness(t, testConfig(), modePanicAt, 2, assign(lane(0, 0, 3)))
	r := h.run()()
	if r.State != pipeline.Failed || !contains(r.Failure.Reason, "panicked") {
		t.Fatalf("report %+v, want a panicked failure", r)
	}
	if o, ok := h.src.committed(0); ok && o > 10 {
		t.Fatalf("committed %d past the panicked batch", o)
	}
}

// ★9
func TestPermanentWatermarkStallFailsPipeline(t *testing.T) {
	cfg := testConfig()
	cfg.StalledFailAfter = 50 * time.Millisecond
	h := newHarness(t, cfg, modeFailAckAt, 1, assign(lane(0, 0, 3)))
	r := h.run()()
	if r.State != pipeline.Failed || r.Failure.Component != "checkpoint" || !contains(r.Failure.Reason, "stalled") {
		t.Fatalf("report %+v, want a checkpoint stall", r.Failure)
	}
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
		if n := h.held.count(); n != 3 {
			t.Fatalf("%d batches entered the chain past a ceiling of 3", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if h.src.pauseCount() != 0 {
		t.Fatal("the ceiling paused the source")
	}
	for h.consumed.Load() < 60 {
		h.held.releaseAll()
		time.Sleep(time.Millisecond)
	}
	h.held.releaseAll()
	waitFor(t, "everything committed", committedAtLeast(h.src, 0, 60))
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
}

// 11
func TestStalledPartitionPlateausAtTheCeiling(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPendingBatches = 3
	h := newHarness(t, cfg, modeFailAckAt, 1, assign(lane(0, 0, 10)))
	wait := h.run()
	waitFor(t, "30 records", func() bool { return h.consumed.Load() == 30 })
	time.Sleep(200 * time.Millisecond) // many passes: the plateau must hold
	if n := h.consumed.Load(); n != 30 {
		t.Fatalf("consumed %d past the plateau of 30", n)
	}
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
	if h.src.pauseCount() != 0 {
		t.Fatal("the ceiling paused the source")
	}
	for h.consumed.Load() < 70 {
		h.held.releaseAll()
		time.Sleep(time.Millisecond)
	}
	h.held.releaseAll()
	waitFor(t, "both partitions committed", func() bool {
		return committedAtLeast(h.src, 0, 60)() && committedAtLeast(h.src, 1, 110)()
	})
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
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
	if r.State != pipeline.Stopped || h.flushes.Load() <= before {
		t.Fatalf("state %v flushes %d -> %d", r.State, before, h.flushes.Load())
	}
	if !slices.Equal(r.FinalWatermarks, []pipeline.Watermark{wm(0, 5)}) || !h.drained.Load() {
		t.Fatalf("final %v drained %v", r.FinalWatermarks, h.drained.Load())
	}
}

// ★14
func TestDrainedSourceCompletesOnItsOwn(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeOK, 0,
		assign(lane(0, 0, 3)),
		waitUntil(func() bool { return h.consumed.Load() == 30 }),
		drained())
	r := h.run()()
	if r.State != pipeline.Completed || !slices.Equal(r.FinalWatermarks, []pipeline.Watermark{wm(0, 30)}) {
		t.Fatalf("report %+v", r)
	}
	if !h.drained.Load() || h.src.flushCommits.Load() < 1 {
		t.Fatal("sink drain or final flush missing")
	}
	if h.src.stopReading.Load() != 0 {
		t.Fatal("a Drained exit has nothing to hand back")
	}
}

// 15
func TestDrainedBeforeAnyData(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, drained())
	r := h.run()()
	if r.State != pipeline.Completed || len(r.FinalWatermarks) != 0 || !h.drained.Load() {
		t.Fatalf("report %+v", r)
	}
}

// ★16
func TestDrainedWithUnacknowledgedBatchesFails(t *testing.T) {
	h := &harness{}
	h = newHarness(t, testConfig(), modeHoldAcks, 0,
		assign(lane(0, 0, 2)),
		waitUntil(func() bool { return h.held.count() == 2 }),
		drained())
	r := h.run()()
	if r.State != pipeline.Failed || r.Failure.Component != "source" || !contains(r.Failure.Reason, "unacknowledged") {
		t.Fatalf("report %+v", r.Failure)
	}
	if len(r.FinalWatermarks) != 0 {
		t.Fatalf("final watermarks %v", r.FinalWatermarks)
	}
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
	if r.State != pipeline.Failed || r.Failure.Component != "source" || !contains(r.Failure.Reason, "did not persist") {
		t.Fatalf("report %+v", r.Failure)
	}
	if len(r.FinalWatermarks) != 0 {
		t.Fatalf("final watermarks %v", r.FinalWatermarks)
	}
}

// ★19
func TestControllerPanicFailsTheRun(t *testing.T) {
	h := newHarness(t, testConfig(), modeBlockForever, 0,
		assign(lane(0, 0, 1)), step{kind: stepPanic})
	r := h.run()()
	if r.State != pipeline.Failed || r.Failure.Component != "controller" {
		t.Fatalf("report %+v", r.Failure)
	}
}

// A graceful stop reads on while the source says so, then hands back.
func TestStopReadsOnUntilTheSourceIsDone(t *testing.T) {
	cfg := testConfig()
	// A stop reads on only until StopReserve before its deadline, never
	// before its trigger: with the default reserve (5s) above the 3s drain
	// timeout it would end its reading at once, and only the drivers' lag
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
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if asked.Load() == 0 {
		t.Fatal("the stop ended its reading without asking the source")
	}
	if h.consumed.Load() < atStop+100 {
		t.Fatalf("the stop did not read on: %d at the stop, %d at the end", atStop, h.consumed.Load())
	}
	if h.src.stopReading.Load() != 1 {
		t.Fatalf("StopReading called %d times, want 1", h.src.stopReading.Load())
	}
	i := h.log.indexAfter("stop_reading", 0)
	if i < 0 || h.log.indexAfter("flush_commits", i) < 0 {
		t.Fatal("the hand-back must precede the final commit flush")
	}
	if len(r.FinalWatermarks) != 1 || r.FinalWatermarks[0].Offset < atStop+100 {
		t.Fatalf("final %v: the reading's data must be committed", r.FinalWatermarks)
	}
}

// A revocation wait renews what the source holds and, once a stop must be
// served, sets the drivers' flag so a blocked batch is abandoned.
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
	if r.State != pipeline.Stopped {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatal("the revocation wait ignored the stop")
	}
}
