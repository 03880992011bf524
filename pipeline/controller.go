package pipeline

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"
)

// stopRequest is a graceful stop: a flag and the instant it was triggered.
type stopRequest struct {
	at   atomic.Int64 // UnixNano of the trigger; written before flag
	flag atomic.Bool
	base time.Time // monotonic anchor for at
}

func newStopRequest() *stopRequest { return &stopRequest{base: time.Now()} }

func (s *stopRequest) trigger(now time.Time) {
	if s.at.CompareAndSwap(0, int64(now.Sub(s.base))+1) {
		s.flag.Store(true)
	}
}

func (s *stopRequest) isSet() bool { return s.flag.Load() }

func (s *stopRequest) triggeredAt() (time.Time, bool) {
	v := s.at.Load()
	if v == 0 {
		return time.Time{}, false
	}
	return s.base.Add(time.Duration(v - 1)), true
}

// stopTimes are the instants a graceful stop runs to, both counted from its
// trigger: the reserve (when the source stops reading) is StopReserve before
// the deadline and never before the trigger.
type stopTimes struct {
	reserveAt, deadline time.Time
}

func newStopTimes(trigger time.Time, drainTimeout, reserve time.Duration) stopTimes {
	deadline := trigger.Add(drainTimeout)
	reserveAt := deadline.Add(-reserve)
	if reserveAt.Before(trigger) {
		reserveAt = trigger
	}
	return stopTimes{reserveAt: reserveAt, deadline: deadline}
}

// stopBudget is fresh, cut so that it ends by deadline (zero past it).
func stopBudget(now, deadline time.Time, fresh time.Duration) time.Duration {
	left := max(deadline.Sub(now), 0)
	return min(fresh, left)
}

// lanesDeadline is the instant the runners and the sink drain end by:
// closeShare before deadline, never before now.
func lanesDeadline(now, deadline time.Time, closeShare time.Duration) time.Time {
	by := deadline.Add(-closeShare)
	if by.Before(now) {
		return now
	}
	return by
}

// stopPoll is how often a revocation's wait looks for a stop.
const stopPoll = 10 * time.Millisecond

type assignedLane struct {
	partition PartitionID
	thread    int
}

// controllerSignal is a controller → main message.
type controllerSignal struct {
	lanesDrained bool
	sinkDeadline time.Time
	finished     *controllerReport
}

type controllerReport struct {
	failure         *FatalError
	drained         bool // the source reported its input drained: the run ended its input
	finalWatermarks []Watermark
	closeBy         time.Time
	unresolved      int64
}

// controller owns the Source, the Checkpointer and the assignment table.
// It is the only goroutine that calls Source methods.
type controller struct {
	cfg         Config
	src         Source
	cp          *Checkpointer
	controls    []*mpsc[controlMsg]
	events      *mpsc[runnerEvent]
	toMain      chan<- controllerSignal
	sinkDrained <-chan struct{}
	stop        *stopRequest
	shutdown    *atomic.Bool
	stopNow     func() time.Time // the clock a stop's reserve and deadlines are read on
	now         func() time.Time // the clock of the commit tick and the chase
	closeShare  time.Duration
	health      *healthState
	m           *metrics
	budget      *inflightBudget
	srcMetrics  *sourceMetrics
	failures    func() string
	sinkFatal   func() *FatalError
	log         *slog.Logger

	assignment    map[LaneID]assignedLane
	threadLoad    []int
	paused        map[LaneID]bool
	epoch         uint32
	pendingCommit map[PartitionID]int64
	pendingMarks  map[PartitionID]commitMark
	// commitWanted: partitions at their uncommitted-bytes ceiling, committed
	// on the next pass unless commits are failing (then the tick retries).
	commitWanted     map[PartitionID]bool
	commitFailing    bool
	commitsFailing   *atomic.Bool // commitFailing, shared with the runners (nil in tests)
	commitWarn       warnLimiter
	pollWarn         warnLimiter
	committed        map[PartitionID]int64
	revokedCommitted map[PartitionID]int64
	failure          *FatalError
}

func (c *controller) fail(fe *FatalError) {
	if c.failure == nil {
		c.failure = fe
	}
}

// run is the controller's life, in three phases: open the source, serve
// it (serve: one pass per turn, until a stop's reading ends, a failure or
// the source's drain) and the drain sequence (drain).
func (c *controller) run() {
	c.assignment = map[LaneID]assignedLane{}
	c.threadLoad = make([]int, len(c.controls))
	c.paused = map[LaneID]bool{}
	c.pendingCommit = map[PartitionID]int64{}
	c.pendingMarks = map[PartitionID]commitMark{}
	c.commitWanted = map[PartitionID]bool{}
	c.committed = map[PartitionID]int64{}
	c.revokedCommitted = map[PartitionID]int64{}

	sig := &stopSignal{flag: &c.stop.flag}
	if err := c.src.Open(SourceCtx{
		Issuer:             c.cp.Issuer(),
		Stop:               sig,
		Metrics:            c.srcMetrics,
		Threads:            len(c.controls),
		PerPartitionDetail: c.cfg.PerPartitionDetail,
	}); err != nil {
		c.fail(fatalf("source", "source open failed: %v", err))
	}
	opened := c.failure == nil
	drainedExit, stopping := c.serve()
	c.drain(sig, opened, drainedExit, stopping)
}

// serving is what the serve loop keeps from one pass to the next.
type serving struct {
	lastCommit time.Time // the last commit tick
	// Partitions whose final acks are chased at fastCommitPoll, each with its
	// own deadline: one shared deadline re-armed by every hint would pin the
	// controller at the fast cadence while any partition stays stalled.
	fastCommit map[PartitionID]time.Time
	// Hinted partitions past their window: committed on any pass that
	// harvested an advance for them, until their lanes leave. The value is
	// the position the chase last sent (nil: none yet), so a retryably failed
	// commit is retried on the next advance or the tick.
	afterWindow map[PartitionID]*int64
	stopping    *stopTimes // a graceful stop's times, once one began
}

// serve runs the controller's passes until the stop's reading ends, the
// pipeline fails or the source drains (drained).
func (c *controller) serve() (drained bool, stopping *stopTimes) {
	sv := &serving{lastCommit: c.now(), fastCommit: map[PartitionID]time.Time{}, afterWindow: map[PartitionID]*int64{}}
	for c.failure == nil {
		revokeBudget, ended := c.stopPhase(sv)
		if ended {
			break
		}
		c.serveRunners()
		if c.failure != nil {
			break
		}
		c.m.inflight.WithLabelValues(compPipeline, compPipeline).Set(float64(c.budget.Usage()))
		// Harvest every pass: advances retire batches from the runners'
		// pending gates, so a gated lane reopens within one pass.
		c.harvest()
		c.commitTick(sv)
		if c.failure != nil {
			break
		}
		c.commitCeiling()
		if c.failure != nil {
			break
		}
		if c.pollSource(sv, revokeBudget) {
			return true, sv.stopping
		}
		c.chase(sv)
	}
	return false, sv.stopping
}

// stopPhase notes a graceful stop once it is requested and reports
// whether its reading has ended; revokeBudget is how long a revocation's
// drain may take now (a revocation during the stop's reading drains its
// lanes by the reserve, which the hand-back, the drain and the close run
// after).
func (c *controller) stopPhase(sv *serving) (revokeBudget time.Duration, ended bool) {
	if sv.stopping == nil && c.stop.isSet() {
		trigger, ok := c.stop.triggeredAt()
		if !ok {
			trigger = c.stopNow()
		}
		st := newStopTimes(trigger, c.cfg.DrainTimeout, c.cfg.StopReserve)
		sv.stopping = &st
		c.m.setState(stateDraining)
	}
	if sv.stopping != nil && (!c.stopNow().Before(sv.stopping.reserveAt) || !c.src.ReadingOnStop()) {
		return 0, true
	}
	if sv.stopping != nil {
		return stopBudget(c.stopNow(), sv.stopping.reserveAt, c.cfg.DrainTimeout), false
	}
	return c.cfg.DrainTimeout, false
}

// serveRunners takes the runners' requests and the sinks' fatal errors.
func (c *controller) serveRunners() {
	// Runner requests.
	for {
		ev, ok := c.events.TryPop()
		if !ok {
			break
		}
		c.handleRunnerEvent(ev)
	}
	if c.sinkFatal != nil {
		if fe := c.sinkFatal(); fe != nil {
			c.fail(fe)
		}
	}
}

// commitTick commits every advanced partition once per CommitInterval.
func (c *controller) commitTick(sv *serving) {
	if now := c.now(); now.Sub(sv.lastCommit) >= c.cfg.CommitInterval {
		sv.lastCommit = now
		// Seal partial chain buffers so a below-target chunk cannot hold
		// its records' acks (and the watermark) under sustained load.
		for _, q := range c.controls {
			q.Push(controlMsg{kind: ctlFlushNow})
		}
		c.commitCycle(nil, false)
		// A watermark stalled behind a failed batch is permanent; past
		// the limit a sink leg is broken for good: fail and replay.
		cpNow := c.cp.Now()
		for _, sp := range c.cp.stalledPartitions() {
			if age := cpNow.Sub(sp.Since); age > c.cfg.StalledFailAfter {
				c.fail(fatalf("checkpoint", "%s", c.withSinkFailures(fmt.Sprintf(
					"partition %d watermark stalled behind a failed batch for %v (limit %v); a sink leg is permanently failing",
					sp.Partition, age, c.cfg.StalledFailAfter))))
				return
			}
		}
	}
}

// commitCeiling commits the partitions at their uncommitted-bytes ceiling
// now, not at the tick, while the store takes commits.
func (c *controller) commitCeiling() {
	if len(c.commitWanted) > 0 {
		if !c.commitFailing {
			c.commitCycle(c.commitWanted, false)
		}
		clear(c.commitWanted)
	}
}

// pollSource serves one event of the source's control plane (waiting at
// most EventPollTimeout, less while a chase is on) and reports whether the
// source drained.
func (c *controller) pollSource(sv *serving, revokeBudget time.Duration) (drained bool) {
	pollTimeout := c.cfg.EventPollTimeout
	if len(sv.fastCommit) > 0 {
		pollTimeout = min(pollTimeout, fastCommitPoll)
	}
	ev, err := c.src.PollEvents(pollTimeout)
	switch {
	case err != nil && isFatal(err):
		c.fail(fatalf("source", "poll_events failed: %v", err))
	case err != nil:
		if ok, suppressed := c.pollWarn.allow(c.now(), commitWarnEvery); ok {
			c.log.Warn("retryable source control-plane error", "error", err, "suppressed_warnings", suppressed)
		}
	default:
		switch ev.Kind {
		case evLanesAssigned:
			c.handleAssign(ev.Lanes, revokeBudget)
			// A new epoch may hand back a hinted partition id; its new
			// lanes have not hinted.
			clear(sv.fastCommit)
			clear(sv.afterWindow)
			if sv.stopping != nil {
				c.m.setState(stateDraining)
			}
		case evLanesRevoked:
			c.handleRevoke(ev.LaneIDs, ev.Barrier, revokeBudget)
		case evLanesRetired:
			c.handleRetired(ev.LaneIDs)
		case evLanesAdded:
			c.handleAdded(ev.Lanes)
		case evCommitReady:
			// Chasing is useless while the tail sits in a chain: flush the
			// owning threads first.
			threads := map[int]bool{}
			for _, p := range ev.Partitions {
				for _, a := range c.assignment {
					if a.partition == p {
						threads[a.thread] = true
					}
				}
			}
			for t := range threads {
				c.controls[t].Push(controlMsg{kind: ctlFlushNow})
			}
			// Each hinted partition gets its own window; a repeated hint
			// does not extend it.
			until := c.now().Add(c.cfg.ChaseWindow)
			for _, p := range ev.Partitions {
				if _, ok := sv.fastCommit[p]; !ok {
					sv.fastCommit[p] = until
				}
			}
		case evDrained:
			c.log.Info("source drained; starting the graceful completion drain")
			return true
		}
	}
	return false
}

// chase commits the fast-commit partitions (just them), standing down
// once their lanes leave the assignment.
func (c *controller) chase(sv *serving) {
	if len(sv.fastCommit) == 0 && len(sv.afterWindow) == 0 || c.failure != nil {
		return
	}
	now := c.now()
	for p, until := range sv.fastCommit {
		if !now.Before(until) {
			delete(sv.fastCommit, p)
			if _, ok := sv.afterWindow[p]; !ok {
				sv.afterWindow[p] = nil
			}
		}
	}
	// An ack that resolved while PollEvents waited is not in this
	// pass's first harvest.
	if len(sv.afterWindow) > 0 {
		c.harvest()
	}
	chasing := map[PartitionID]bool{}
	for p := range sv.fastCommit {
		chasing[p] = true
	}
	for p, sent := range sv.afterWindow {
		if o, ok := c.pendingCommit[p]; ok && (sent == nil || *sent != o) {
			chasing[p] = true
		}
	}
	// While commits fail the tick retries them: a chase at
	// fastCommitPoll would hammer a store that refuses writes.
	if len(chasing) > 0 && !c.commitFailing {
		c.commitCycle(chasing, false)
		for p := range chasing {
			if _, ok := sv.afterWindow[p]; ok {
				if o, ok := c.pendingCommit[p]; ok {
					sv.afterWindow[p] = &o
				}
			}
		}
	}
	// Stand down when the unit of work is done (its lanes left), not
	// because its acks look quiet for an instant.
	live := c.livePartitions()
	for p := range sv.fastCommit {
		if !live[p] {
			delete(sv.fastCommit, p)
		}
	}
	for p := range sv.afterWindow {
		if !live[p] {
			delete(sv.afterWindow, p)
		}
	}
}

// drain is the drain sequence (after a stop, a failure or the source's
// drain): the runners stop and flush, the sinks drain, the final commit
// lands and the controller reports to main.
func (c *controller) drain(sig *stopSignal, opened, drainedExit bool, stopping *stopTimes) {
	// Set the runners' flag: a runner retrying a blocked batch watches only
	// that, and main joins runners without a timeout.
	c.shutdown.Store(true)
	// The drain's commits, the final one included, run with the signal clear.
	sig.close()
	if c.failure != nil {
		c.m.setState(stateFailed)
	} else {
		c.m.setState(stateDraining)
	}
	// End the stop's reading (a coordinated source leaves the fleet); what
	// the source holds is handed back at Close, after the final commit.
	if opened && !drainedExit {
		if err := c.src.StopReading(); err != nil {
			c.log.Warn("the source could not end its reading cleanly", "error", err)
		}
	}
	// A graceful stop's deadline counts from its trigger.
	deadline := c.stopNow().Add(c.cfg.DrainTimeout)
	if stopping != nil {
		deadline = stopping.deadline
	}
	lanesBy := lanesDeadline(c.stopNow(), deadline, c.closeShare)

	// Every runner flushes its chain, drops its lanes and arrives.
	barrier := newDrainBarrier(len(c.controls))
	for _, q := range c.controls {
		q.Push(controlMsg{kind: ctlShutdown, barrier: barrier, deadline: lanesBy})
	}
	if !barrier.Wait(lanesBy.Sub(c.stopNow())) {
		c.log.Error("runners did not finish draining before the deadline", "remaining", barrier.Remaining())
	}
	// A runner's last flush can report a fatal after the loop stopped
	// reading events: take the failures the drain produced.
	for {
		ev, ok := c.events.TryPop()
		if !ok {
			break
		}
		if ev.kind == evFatal {
			c.log.Error("pipeline thread reported fatal", "thread", ev.thread, "error", ev.err)
			c.fail(ev.err)
		}
	}
	if c.failure != nil {
		c.m.setState(stateFailed)
	}

	// Main joins the runners (closing the sink queues) and drains the sink.
	c.toMain <- controllerSignal{lanesDrained: true, sinkDeadline: lanesBy}
	sinkBudget := max(lanesBy.Sub(c.stopNow()), 0) + 2*time.Second
	t := time.NewTimer(sinkBudget)
	select {
	case <-c.sinkDrained:
	case <-t.C:
		c.log.Error("sink drain did not report before the deadline")
	}
	t.Stop()
	c.finalCommit(drainedExit)
	c.report(drainedExit, deadline)
}

// finalCommit is the drain's last harvest and commit: only durably written
// batches advanced. After the source's drain it fails the run if anything
// stayed unacknowledged or uncommitted.
func (c *controller) finalCommit(drainedExit bool) {
	c.commitCycle(nil, true)
	finalFlushFailed := false
	if err := c.src.FlushCommits(); err != nil {
		c.log.Error("final commit flush failed; positions will replay", "error", err)
		finalFlushFailed = true
	}

	// Drained-exit backstop: a bounded source's Completed means every record
	// was durably committed.
	if drainedExit && c.failure == nil {
		if pending := c.cp.MaxPending(); pending > 0 {
			c.fail(fatalf("source", "%s", c.withSinkFailures(fmt.Sprintf(
				"source drained but unacknowledged batches remain (max %d on one partition); their data was not durably committed — rerun to complete",
				pending))))
		} else if len(c.pendingCommit) > 0 || finalFlushFailed {
			extra := ""
			if finalFlushFailed {
				extra = ", final flush failed"
			}
			c.fail(fatalf("source",
				"source drained and every batch was acknowledged, but the final watermark commit did not persist (%d partition(s) uncommitted%s); the checkpoint holds stale offsets — rerun to replay the tail and complete",
				len(c.pendingCommit), extra))
		}
		if c.failure != nil {
			c.m.setState(stateFailed)
		}
	}
}

// report hands main the run's outcome and the committed watermarks.
func (c *controller) report(drainedExit bool, deadline time.Time) {
	final := make([]Watermark, 0, len(c.committed))
	for _, p := range slices.Sorted(maps.Keys(c.committed)) {
		final = append(final, Watermark{Partition: p, Offset: c.committed[p]})
	}
	c.toMain <- controllerSignal{finished: &controllerReport{
		failure:         c.failure,
		drained:         drainedExit,
		finalWatermarks: final,
		closeBy:         deadline,
	}}
}

func (c *controller) withSinkFailures(reason string) string {
	if c.failures != nil {
		if f := c.failures(); f != "" {
			return reason + "; " + f
		}
	}
	return reason
}

func (c *controller) livePartitions() map[PartitionID]bool {
	live := make(map[PartitionID]bool, len(c.assignment))
	for _, a := range c.assignment {
		live[a.partition] = true
	}
	return live
}

func (c *controller) handleRunnerEvent(ev runnerEvent) {
	switch ev.kind {
	case evPause:
		var newly []LaneID
		for _, l := range ev.lanes {
			if _, ok := c.assignment[l]; ok && !c.paused[l] {
				newly = append(newly, l)
			}
		}
		if len(newly) == 0 {
			return
		}
		if err := c.src.Pause(newly); err != nil {
			c.log.Warn("source pause failed", "error", err)
			return
		}
		for _, l := range newly {
			c.paused[l] = true
		}
	case evResume:
		var resumable []LaneID
		for _, l := range ev.lanes {
			if c.paused[l] {
				resumable = append(resumable, l)
			}
		}
		if len(resumable) == 0 {
			return
		}
		if err := c.src.Resume(resumable); err != nil {
			c.log.Warn("source resume failed", "error", err)
			return
		}
		for _, l := range resumable {
			delete(c.paused, l)
		}
	case evFatal:
		c.log.Error("pipeline thread reported fatal", "thread", ev.thread, "error", ev.err)
		c.fail(ev.err)
	case evCommitWanted:
		for _, p := range ev.partitions {
			c.commitWanted[p] = true
		}
	}
}

// harvest drains registrations and resolutions and folds the watermarks
// that advanced into pendingCommit, merged by max so a retried commit never
// regresses.
func (c *controller) harvest() {
	st, err := c.cp.drain()
	if err != nil {
		var fe *FatalError
		if e, ok := err.(*FatalError); ok {
			fe = e
		} else {
			fe = fatalf("checkpoint", "%v", err)
		}
		c.fail(fe)
	}
	if st.staleEpoch > 0 || st.unknown > 0 {
		c.log.Debug("discarded stale acknowledgments", "stale", st.staleEpoch, "unknown", st.unknown)
	}
	for _, w := range c.cp.TakeWatermarks() {
		if cur, ok := c.pendingCommit[w.Partition]; !ok || w.Offset > cur {
			c.pendingCommit[w.Partition] = w.Offset
		}
		c.pendingMarks[w.Partition] = c.cp.mark(w.Partition)
	}
}

// commitCycle harvests, publishes checkpoint health and commits what
// advanced (only the partitions in only, when given). A failed tick commit
// is retried next tick; the final pass has no next tick.
func (c *controller) commitCycle(only map[PartitionID]bool, final bool) {
	c.harvest()
	maxPending := c.cp.MaxPending()
	c.m.pendingBatches.WithLabelValues(compCheck, compCheck).Set(float64(maxPending))
	if only == nil && c.cfg.PerPartitionDetail {
		c.m.partitionPending.Reset()
		for _, pc := range c.cp.pendingByPartition() {
			c.m.partitionPending.WithLabelValues(compCheck, compCheck, fmt.Sprint(pc.Partition)).Set(float64(pc.N))
		}
	}
	var age time.Duration
	now := c.cp.Now()
	for _, sp := range c.cp.stalledPartitions() {
		age = max(age, now.Sub(sp.Since))
	}
	c.m.watermarkAge.WithLabelValues(compCheck, compCheck).Set(age.Seconds())
	c.health.reportWatermark(age, maxPending > 0)

	if len(c.pendingCommit) == 0 {
		return
	}
	var positions []Watermark
	for _, p := range slices.Sorted(maps.Keys(c.pendingCommit)) {
		if only == nil || only[p] {
			positions = append(positions, Watermark{Partition: p, Offset: c.pendingCommit[p]})
		}
	}
	if len(positions) == 0 {
		return
	}
	start := time.Now()
	err := c.src.Commit(positions)
	c.m.commit(err == nil, time.Since(start))
	var deferred map[PartitionID]bool
	if d, ok := c.src.(commitDeferrer); ok && err == nil {
		parts, derr := d.TakeDeferred()
		// The final pass has no next tick: what it deferred rides the
		// source's own retries, as before.
		if len(parts) > 0 && !final {
			deferred = make(map[PartitionID]bool, len(parts))
			for _, p := range parts {
				deferred[p] = true
			}
			if derr == nil {
				derr = fmt.Errorf("%d commit(s) deferred", len(parts))
			}
			err = derr
		}
	}
	switch {
	case err == nil || deferred != nil:
		for _, w := range positions {
			if deferred[w.Partition] {
				continue // retried next tick; not committed for the ceiling
			}
			delete(c.pendingCommit, w.Partition)
			c.pendingMarks[w.Partition].landed()
			delete(c.pendingMarks, w.Partition)
			// A retried commit can land after its partition left; the exit
			// report lists it only if an assignment hands it back.
			if c.cp.Tracks(w.Partition) {
				c.committed[w.Partition] = w.Offset
			} else {
				c.revokedCommitted[w.Partition] = w.Offset
			}
		}
		if deferred != nil {
			c.commitNotLanded(err, len(deferred))
		} else if only == nil {
			c.commitLanded()
		}
	case isFatal(err):
		c.fail(fatalf("source", "commit failed fatally: %v", err))
	case final:
		c.log.Warn("final commit failed; uncommitted positions may replay", "error", err)
	default:
		c.commitNotLanded(err, len(positions))
	}
}

// commitWarnEvery is the least interval between two warnings of failing
// commits: the first failure warns at once, later ones are counted and
// reported with the next warning, or when commits land again.
const commitWarnEvery = 30 * time.Second

// commitNotLanded notes a tick whose commit of n partitions failed or was
// deferred, warning rate-limited.
func (c *controller) commitNotLanded(err error, n int) {
	c.commitFailing = true
	if c.commitsFailing != nil {
		c.commitsFailing.Store(true)
	}
	if ok, suppressed := c.commitWarn.allow(c.now(), commitWarnEvery); ok {
		c.log.Warn("commit failed; retrying next tick; reading stops until a commit lands",
			"error", err, "partitions", n, "suppressed_warnings", suppressed,
			"ceiling_bytes", c.cfg.MaxUncommittedBytes)
	}
}

// commitLanded notes a tick whose commit landed whole.
func (c *controller) commitLanded() {
	if !c.commitFailing {
		return
	}
	c.commitFailing = false
	if c.commitsFailing != nil {
		c.commitsFailing.Store(false)
	}
	if failed, since := c.commitWarn.recover(); failed > 0 {
		c.log.Info("commits landing again", "failed_commits", failed, "failing_for", c.now().Sub(since).Round(time.Millisecond))
	}
}

// warnLimiter lets the first of a run of repeated warnings through, then
// at most one per interval, counting the ones it holds back.
type warnLimiter struct {
	last, first time.Time
	suppressed  int
	total       int
}

// allow reports whether to warn now, and how many warnings were held back
// since the last one let through.
func (w *warnLimiter) allow(now time.Time, every time.Duration) (bool, int) {
	if w.total == 0 {
		w.first = now
	}
	w.total++
	if !w.last.IsZero() && now.Sub(w.last) < every {
		w.suppressed++
		return false, 0
	}
	n := w.suppressed
	w.last, w.suppressed = now, 0
	return true, n
}

// recover ends the run: how many warnings it counted and when it began.
// The next one warns at once.
func (w *warnLimiter) recover() (int, time.Time) {
	n, first := w.total, w.first
	*w = warnLimiter{}
	return n, first
}

// placeGroups puts each partition's lanes on the least-loaded thread (ties
// to the lowest index): lanes of one partition share a thread because
// sequence counters are per issuer.
func (c *controller) placeGroups(lanes []Lane) {
	groups := map[PartitionID][]Lane{}
	var order []PartitionID
	for _, l := range lanes {
		p := l.Partition()
		if _, ok := groups[p]; !ok {
			order = append(order, p)
		}
		groups[p] = append(groups[p], l)
	}
	for _, p := range order {
		thread := 0
		for i, load := range c.threadLoad {
			if load < c.threadLoad[thread] {
				thread = i
			}
		}
		var gate *pendingGate
		if g, ok := c.cp.Gate(p); ok {
			gate = &g
		} else {
			c.log.Warn("no advance counter for an assigned partition; its lanes run ungated", "partition", p)
		}
		for _, l := range groups[p] {
			c.assignment[l.ID()] = assignedLane{partition: p, thread: thread}
			c.threadLoad[thread]++
			c.controls[thread].Push(controlMsg{kind: ctlAddLane, lane: l, gate: gate})
		}
	}
}

func partitionsOf(lanes []Lane) []PartitionID {
	seen := map[PartitionID]bool{}
	var out []PartitionID
	for _, l := range lanes {
		if !seen[l.Partition()] {
			seen[l.Partition()] = true
			out = append(out, l.Partition())
		}
	}
	return out
}

// handleAssign applies a full replacement assignment, draining and revoking
// any live lanes first (sources should revoke before reassigning).
func (c *controller) handleAssign(lanes []Lane, budget time.Duration) {
	if len(c.assignment) > 0 {
		c.log.Warn("assignment received while lanes are live; draining and revoking them first (sources should revoke before reassigning)",
			"live_lanes", len(c.assignment))
		live := slices.Collect(maps.Keys(c.assignment))
		c.revokeLanes(live, newDrainBarrier(len(live)), budget)
	}
	c.epoch++
	parts := partitionsOf(lanes)
	if err := c.cp.BeginEpoch(parts, c.epoch); err != nil {
		c.fail(err.(*FatalError))
		return
	}
	// A partition handed back keeps its watermark in the exit report.
	inNew := map[PartitionID]bool{}
	for _, p := range parts {
		inNew[p] = true
	}
	for p, o := range c.revokedCommitted {
		if inNew[p] {
			if _, ok := c.committed[p]; !ok {
				c.committed[p] = o
			}
		}
	}
	clear(c.revokedCommitted)
	c.placeGroups(lanes)
	c.health.setAssignmentReceived()
	c.m.rebalances.WithLabelValues(compSource, compSource, "assign").Inc()
	c.m.lanesActive.WithLabelValues(compSource, compSource).Set(float64(len(c.assignment)))
	c.m.setState(stateRunning)
}

// handleAdded merges lanes into the current epoch. The checkpointer admits
// their partitions before any lane reaches a runner.
func (c *controller) handleAdded(lanes []Lane) {
	if len(lanes) == 0 {
		return
	}
	// A revoked partition cannot return in this epoch.
	clear(c.revokedCommitted)
	if err := c.cp.ExtendEpoch(partitionsOf(lanes)); err != nil {
		c.fail(err.(*FatalError))
		return
	}
	c.placeGroups(lanes)
	c.m.lanesActive.WithLabelValues(compSource, compSource).Set(float64(len(c.assignment)))
}

func (c *controller) handleRevoke(lanes []LaneID, barrier *drainBarrier, budget time.Duration) {
	c.m.rebalances.WithLabelValues(compSource, compSource, "revoke").Inc()
	if barrier == nil {
		barrier = newDrainBarrier(len(lanes))
	}
	c.revokeLanes(lanes, barrier, budget)
	c.m.lanesActive.WithLabelValues(compSource, compSource).Set(float64(len(c.assignment)))
}

// handleRetired removes finished lanes: no barrier, commit or flush. It is
// the backfill hot path (one retirement per finished split).
func (c *controller) handleRetired(lanes []LaneID) {
	byThread := map[int][]LaneID{}
	for _, l := range lanes {
		if a, ok := c.assignment[l]; ok {
			byThread[a.thread] = append(byThread[a.thread], l)
		} else {
			c.log.Warn("retirement for an unassigned lane", "lane", l)
		}
	}
	for t, sub := range byThread {
		c.controls[t].Push(controlMsg{kind: ctlDropLanes, lanes: sub})
	}
	gone := c.removeAssigned(lanes)
	c.cp.Revoke(gone)
	for _, p := range gone {
		delete(c.committed, p)
	}
	c.m.lanesActive.WithLabelValues(compSource, compSource).Set(float64(len(c.assignment)))
}

// removeAssigned drops lanes from the assignment and returns the
// partitions left without a lane.
func (c *controller) removeAssigned(lanes []LaneID) []PartitionID {
	parts := map[PartitionID]bool{}
	for _, l := range lanes {
		if a, ok := c.assignment[l]; ok {
			parts[a.partition] = true
			c.threadLoad[a.thread] = max(c.threadLoad[a.thread]-1, 0)
			delete(c.assignment, l)
		}
		delete(c.paused, l)
	}
	live := c.livePartitions()
	var gone []PartitionID
	for p := range parts {
		if !live[p] {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	return gone
}

// revokeLanes stops the owning threads, waits for the drain, commits what
// it acknowledged, then drops tracking of partitions left without lanes.
func (c *controller) revokeLanes(lanes []LaneID, barrier *drainBarrier, budget time.Duration) {
	deadline := c.stopNow().Add(budget)
	byThread := map[int][]LaneID{}
	for _, l := range lanes {
		if a, ok := c.assignment[l]; ok {
			byThread[a.thread] = append(byThread[a.thread], l)
		} else {
			// No thread would arrive for it.
			c.log.Warn("revocation for an unassigned lane", "lane", l)
			barrier.Arrive()
		}
	}
	for t, sub := range byThread {
		c.controls[t].Push(controlMsg{kind: ctlStopLanes, lanes: sub, barrier: barrier, deadline: deadline})
	}
	if !c.waitRevocation(barrier, deadline) {
		c.log.Error("lane drain did not finish before the deadline; unflushed records will replay", "remaining", barrier.Remaining())
	}
	c.commitCycle(nil, false)
	if err := c.src.FlushCommits(); err != nil {
		c.log.Warn("flush of stored commits failed during revocation", "error", err)
	}
	for _, p := range c.removeAssignedRevoked(lanes) {
		if o, ok := c.committed[p]; ok {
			delete(c.committed, p)
			c.revokedCommitted[p] = o
		}
	}
}

func (c *controller) removeAssignedRevoked(lanes []LaneID) []PartitionID {
	gone := c.removeAssigned(lanes)
	c.cp.Revoke(gone)
	return gone
}

// waitRevocation waits for a revocation's barrier until deadline. The
// source renews what it holds in slices (it gets no PollEvents meanwhile),
// and a stop the runners must serve now sets their flag so a runner held by
// a blocked batch abandons it and arrives.
func (c *controller) waitRevocation(barrier *drainBarrier, deadline time.Time) bool {
	for {
		left := deadline.Sub(c.stopNow())
		if barrier.Wait(min(left, stopPoll)) {
			return true
		}
		if !c.stopNow().Before(deadline) {
			return false
		}
		c.src.RenewHeld()
		if !c.shutdown.Load() && c.stopEndsTheWait() {
			c.shutdown.Store(true)
		}
	}
}

func (c *controller) stopEndsTheWait() bool {
	if !c.stop.isSet() {
		return false
	}
	trigger, ok := c.stop.triggeredAt()
	if !ok {
		trigger = c.stopNow()
	}
	st := newStopTimes(trigger, c.cfg.DrainTimeout, c.cfg.StopReserve)
	return !c.stopNow().Before(st.reserveAt) || !c.src.ReadingOnStop()
}
