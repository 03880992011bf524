package pipeline

import (
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"
)

type controlKind uint8

const (
	ctlAddLane controlKind = iota
	ctlStopLanes
	ctlFlushNow
	ctlDropLanes
	ctlShutdown
)

// controlMsg is a controller → runner message.
type controlMsg struct {
	kind     controlKind
	lane     Lane
	gate     *pendingGate
	lanes    []LaneID
	barrier  *drainBarrier
	deadline time.Time
}

type runnerEventKind uint8

const (
	evPause runnerEventKind = iota
	evResume
	evFatal
	// evCommitWanted: the partitions reached their uncommitted-bytes
	// ceiling; a commit now reopens them.
	evCommitWanted
)

// runnerEvent is a runner → controller message.
type runnerEvent struct {
	kind       runnerEventKind
	lanes      []LaneID
	partitions []PartitionID
	thread     int
	err        *FatalError
}

type gateState struct {
	epoch    uint32
	advanced *atomic.Uint64
	issued   uint64
	gated    bool
	lastWarn time.Time

	// The uncommitted-bytes ceiling: committed is the partition's
	// committed-batch counter, sizes the polled batches not yet committed
	// past (sizes[head:], in sequence order) and uncommitted their bytes.
	committed     *atomic.Uint64
	sizes         []seqBytes
	head          int
	uncommitted   int64
	bytesGated    bool
	lastBytesWarn time.Time
	lastWant      time.Time
}

type seqBytes struct {
	seq   uint64
	bytes int64
}

// polled counts a batch of the gate's epoch.
func (g *gateState) polled(seq uint64, bytes int64) {
	if g.committed == nil {
		return
	}
	g.sizes = append(g.sizes, seqBytes{seq: seq, bytes: bytes})
	g.uncommitted += bytes
}

// settle drops the batches committed past and returns the bytes left.
func (g *gateState) settle() int64 {
	if g.committed == nil {
		return 0
	}
	c := g.committed.Load()
	for g.head < len(g.sizes) && g.sizes[g.head].seq < c {
		g.uncommitted -= g.sizes[g.head].bytes
		g.head++
	}
	if g.head == len(g.sizes) {
		g.sizes, g.head = g.sizes[:0], 0
	} else if g.head > 64 && g.head > len(g.sizes)/2 {
		n := copy(g.sizes, g.sizes[g.head:])
		g.sizes, g.head = g.sizes[:n], 0
	}
	return g.uncommitted
}

// runner is one pipeline goroutine: it polls its lanes round-robin, pushes
// batches through its chain, applies backpressure and serves control
// messages before every lane poll.
type runner struct {
	i           int
	cfg         *Config
	ctl         *mpsc[controlMsg]
	events      *mpsc[runnerEvent]
	chain       runnerChain
	bp          *watermarkController
	budget      *inflightBudget
	queuesBelow func(float64) bool
	health      *healthState
	shutdown    *atomic.Bool
	// commitsFailing is set by the controller while its commits do not
	// land: nothing read then can be committed, and all of it replays if
	// the splits' leases run out meanwhile, so a partition with anything
	// uncommitted is not polled until a commit lands.
	commitsFailing *atomic.Bool
	m              runnerMetrics
	log            *slog.Logger
	component      string

	lanes            []Lane
	gates            map[PartitionID]*gateState
	nextLane         int
	lastData         time.Time
	bufferedSince    time.Time // the first data since the last flush
	flushedSinceData bool
	pauseStarted     time.Time
	emptyPolls       int
	gatedStreak      int
	parked           *controlMsg
	fatal            bool
	lastPollWarn     time.Time
	bytesWarn        warnLimiter
}

// runnerExit is how a runner goroutine ended.
type runnerExit struct {
	failed bool
	panic  *FatalError // a panic outside the batch guard
}

func (r *runner) run() (exit runnerExit) {
	defer func() {
		if v := recover(); v != nil {
			// The shutdown barrier counts this runner: report, then keep
			// answering control messages until Shutdown like any failed one.
			fe := fatalf(r.component, "pipeline thread panicked outside the batch guard: %v", v)
			exit = runnerExit{failed: true, panic: fe}
			r.events.Push(runnerEvent{kind: evFatal, thread: r.i, err: fe})
			func() {
				defer func() { _ = recover() }()
				if r.chain != nil {
					r.chain.Close()
				}
			}()
			r.chain = nil
			r.parkUntilShutdown()
		}
	}()
	r.lastData = time.Now()
	r.flushedSinceData = true
	for {
		r.health.beat(r.i)
		if r.serveControl() {
			return runnerExit{}
		}
		if r.fatal {
			if r.chain != nil {
				r.chain.Close()
				r.chain = nil
			}
			r.parkUntilShutdown()
			return runnerExit{failed: true}
		}
		if r.backpressureTick() {
			time.Sleep(r.cfg.PollTimeout)
			continue
		}
		if len(r.lanes) == 0 {
			r.parkControl()
			r.idleFlush()
			continue
		}
		idx := r.nextLane % len(r.lanes)
		r.nextLane++
		lane := r.lanes[idx]
		timeout := time.Duration(0)
		if r.emptyPolls >= len(r.lanes) {
			timeout = r.cfg.PollTimeout
		}
		if r.isGated(lane) {
			r.gatedStreak++
			if r.gatedStreak >= len(r.lanes) {
				r.gatedStreak = 0
				r.parkControl()
				r.idleFlush()
			}
			continue
		}
		r.gatedStreak = 0
		start := time.Now()
		batch, err := lane.Poll(r.cfg.MaxRecords, timeout)
		end := time.Now()
		r.m.poll.Observe(end.Sub(start).Seconds())
		switch {
		case err != nil && isFatal(err):
			if batch != nil && batch.Ack != nil {
				batch.Ack.Abandon()
			}
			r.reportFatal(fatalf(r.component, "source poll failed: %v", err))
		case err != nil:
			if batch != nil && batch.Ack != nil {
				batch.Ack.Abandon()
			}
			r.emptyPolls++
			if time.Since(r.lastPollWarn) > 10*time.Second {
				r.lastPollWarn = time.Now()
				r.log.Warn("lane poll failed; polling it again later", "lane", lane.ID(), "error", err)
			}
		case batch == nil:
			r.emptyPolls++
			r.idleFlush()
		default:
			r.emptyPolls = 0
			r.lastData = end
			if r.flushedSinceData {
				r.bufferedSince = end
			}
			r.flushedSinceData = false
			r.onBatch(batch)
			r.idleFlush()
		}
	}
}

// onBatch counts, gates and drives one polled batch, then releases the
// runtime's reference to its acknowledgment.
func (r *runner) onBatch(b *Batch) {
	if b.Ack == nil {
		r.reportFatal(fatalf(r.component, "lane returned a batch without an acknowledgment handle"))
		return
	}
	var bytes int
	for i := range b.Payloads {
		bytes += len(b.Payloads[i].Value) + len(b.Payloads[i].Key)
	}
	if g := r.gates[b.Ack.ID().Partition]; g != nil && g.epoch == b.Ack.ID().Epoch {
		g.issued = max(g.issued, b.Ack.ID().Seq+1)
		g.polled(b.Ack.ID().Seq, int64(bytes))
	}
	r.m.records.Add(float64(len(b.Payloads)))
	r.m.bytes.Add(float64(bytes))
	if err := r.runBatch(b); err != nil {
		r.reportFatal(err)
	}
	b.Ack.Release()
}

// runBatch pushes b until the chain takes all of it. Every way out but
// success fails the batch's acknowledgment.
func (r *runner) runBatch(b *Batch) (fe *FatalError) {
	defer func() {
		if v := recover(); v != nil {
			b.Ack.Fail()
			fe = fatalf(r.component, "operator chain panicked: %v", v)
		}
	}()
	from := 0
	waiter, _ := r.chain.(roomWaiter)
	var blockedSince time.Time
	for retry := false; ; retry = true {
		if retry {
			r.health.beat(r.i) // the poll loop beat just before the first push
		}
		out := r.chain.PushBatch(b, from)
		switch out.Kind {
		case pushDone:
			return nil
		case pushFatal:
			b.Ack.Fail()
			if out.Err == nil {
				return fatalf(r.component, "operator chain failed")
			}
			return out.Err
		}
		from = max(from, out.ResumeAt)
		if r.shutdown.Load() {
			r.log.Warn("abandoning a blocked batch for the shutdown; it replays", "batch", b.Ack.ID())
			b.Ack.Fail()
			r.chain.AbandonBatch()
			return nil
		}
		if out.Reason != blockCapacity {
			time.Sleep(r.cfg.BlockedRetry)
			continue
		}
		// A full sink queue. Within the grace the runner only waits for
		// the queue to take the parked chunk (it polls nothing meanwhile);
		// a refusal that outlasts the grace is backpressure and pauses the
		// source.
		now := time.Now()
		if blockedSince.IsZero() {
			blockedSince = now
		}
		if waiter == nil || now.Sub(blockedSince) >= r.cfg.BlockGrace {
			r.bp.onSendRejected()
			r.applyTransition(r.bp.tick(r.budget.Usage(), r.queuesBelow(r.cfg.LowRatio)))
		}
		if waiter != nil {
			waiter.waitRoom(r.cfg.BlockedRetry)
		} else {
			time.Sleep(r.cfg.BlockedRetry)
		}
	}
}

func (r *runner) reportFatal(err *FatalError) {
	r.fatal = true
	r.events.Push(runnerEvent{kind: evFatal, thread: r.i, err: err})
}

// serveControl handles the parked message and every queued one. It
// reports whether the runner must exit (Shutdown).
func (r *runner) serveControl() bool {
	if r.parked != nil {
		msg := *r.parked
		r.parked = nil
		if r.handle(msg) {
			return true
		}
	}
	for {
		msg, ok := r.ctl.TryPop()
		if !ok {
			return false
		}
		if r.handle(msg) {
			return true
		}
	}
}

func (r *runner) handle(msg controlMsg) bool {
	switch msg.kind {
	case ctlAddLane:
		r.lanes = append(r.lanes, msg.lane)
		p := msg.lane.Partition()
		if msg.gate != nil {
			if g := r.gates[p]; g == nil || g.epoch < msg.gate.Epoch {
				r.gates[p] = &gateState{epoch: msg.gate.Epoch, advanced: msg.gate.Advanced, committed: msg.gate.Committed}
			}
		}
	case ctlStopLanes:
		n := r.removeLanes(msg.lanes)
		if n > 0 {
			r.flushUntil(msg.deadline)
		}
		for range n {
			msg.barrier.Arrive()
		}
	case ctlFlushNow:
		r.flushOnce()
	case ctlDropLanes:
		r.removeLanes(msg.lanes)
	case ctlShutdown:
		r.flushUntil(msg.deadline)
		r.lanes = nil
		clear(r.gates)
		if r.chain != nil {
			r.chain.Close()
			r.chain = nil
		}
		msg.barrier.Arrive()
		return true
	}
	return false
}

// removeLanes drops the listed lanes it holds and the gates of partitions
// it no longer has lanes for; it returns how many it removed.
func (r *runner) removeLanes(ids []LaneID) int {
	n := 0
	r.lanes = slices.DeleteFunc(r.lanes, func(l Lane) bool {
		if slices.Contains(ids, l.ID()) {
			n++
			return true
		}
		return false
	})
	for p := range r.gates {
		if !slices.ContainsFunc(r.lanes, func(l Lane) bool { return l.Partition() == p }) {
			delete(r.gates, p)
		}
	}
	return n
}

func (r *runner) isGated(l Lane) bool {
	g := r.gates[l.Partition()]
	if g == nil {
		return false
	}
	adv := g.advanced.Load()
	pending := uint64(0)
	if g.issued > adv {
		pending = g.issued - adv
	}
	gated := pending >= uint64(r.cfg.MaxPendingBatches)
	if gated && !g.gated {
		if time.Since(g.lastWarn) > 10*time.Second {
			g.lastWarn = time.Now()
			r.log.Warn("partition at its pending-batch ceiling; not polling it until its watermark advances",
				"partition", l.Partition(), "pending", pending, "ceiling", r.cfg.MaxPendingBatches)
		}
	} else if !gated && g.gated {
		r.log.Debug("partition below its pending-batch ceiling again", "partition", l.Partition())
	}
	g.gated = gated
	return r.bytesGated(l.Partition(), g) || gated
}

// bytesGated applies the uncommitted-bytes ceiling to g, asking the
// controller for a commit when the partition reaches it.
func (r *runner) bytesGated(p PartitionID, g *gateState) bool {
	limit := r.cfg.MaxUncommittedBytes
	if limit <= 0 || g.committed == nil {
		return false
	}
	n := g.settle()
	if n > 0 && n < limit && r.commitsFailing != nil && r.commitsFailing.Load() {
		// Commits are not landing: what is read now cannot be committed
		// and replays if the leases run out. The controller retries its
		// commit every tick; asking for more would only hammer the store.
		return true
	}
	gated := n >= limit
	if gated && time.Since(g.lastWant) >= r.cfg.EventPollTimeout {
		// Repeated while gated: the commit that lands may not cover it all.
		g.lastWant = time.Now()
		r.events.Push(runnerEvent{kind: evCommitWanted, thread: r.i, partitions: []PartitionID{p}})
	}
	if gated && !g.bytesGated {
		// One line per runner and interval, not per partition: a store
		// refusing commits gates every partition at about the same time.
		if ok, suppressed := r.bytesWarn.allow(time.Now(), commitWarnEvery); ok {
			r.log.Warn("partition at its uncommitted-bytes ceiling; not polling it until a commit lands",
				"partition", p, "uncommitted_bytes", n, "ceiling", limit, "suppressed_warnings", suppressed)
		}
	} else if !gated && g.bytesGated {
		r.log.Debug("partition below its uncommitted-bytes ceiling again", "partition", p)
	}
	g.bytesGated = gated
	return gated
}

// parkControl waits on the control queue for up to the poll timeout,
// keeping any message for the next serveControl.
func (r *runner) parkControl() {
	if msg, ok := r.ctl.PopWait(r.cfg.PollTimeout); ok {
		r.parked = &msg
	}
}

// backpressureTick applies a transition and reports whether the runner is
// paused.
func (r *runner) backpressureTick() bool {
	r.applyTransition(r.bp.tick(r.budget.Usage(), r.queuesBelow(r.cfg.LowRatio)))
	return r.bp.paused
}

func (r *runner) applyTransition(t bpTransition) {
	switch t {
	case bpPause:
		r.pauseStarted = time.Now()
		r.m.paused.Set(1)
		r.m.pauseEvents.Inc()
		r.events.Push(runnerEvent{kind: evPause, thread: r.i, lanes: r.laneIDs()})
	case bpResume:
		r.m.paused.Set(0)
		r.m.pausedSeconds.Add(time.Since(r.pauseStarted).Seconds())
		r.events.Push(runnerEvent{kind: evResume, thread: r.i, lanes: r.laneIDs()})
	}
}

func (r *runner) laneIDs() []LaneID {
	ids := make([]LaneID, len(r.lanes))
	for i, l := range r.lanes {
		ids[i] = l.ID()
	}
	return ids
}

func (r *runner) flushOnce() {
	if r.chain == nil {
		return
	}
	out := r.safeFlush()
	switch out.Kind {
	case pushDone:
		r.flushedSinceData = true
	case pushBlocked:
		if out.Reason == blockCapacity {
			r.bp.onSendRejected()
		}
	case pushFatal:
		r.reportFatal(out.Err)
	}
}

func (r *runner) safeFlush() (out pushOutcome) {
	defer func() {
		if v := recover(); v != nil {
			out = pushOutcome{Kind: pushFatal, Err: fatalf(r.component, "operator chain panicked: %v", v)}
		}
	}()
	out = r.chain.Flush()
	if out.Kind == pushFatal && out.Err == nil {
		out.Err = fatalf(r.component, "operator chain flush failed")
	}
	return out
}

// idleFlush flushes the chain once its data has been idle for IdleFlush,
// or has waited that long in its buffers: a trickle of records (a
// followed file) is then never held until the next commit tick, which
// would put a whole commit interval into its latency.
func (r *runner) idleFlush() {
	if r.flushedSinceData {
		return
	}
	if now := time.Now(); now.Sub(r.lastData) < r.cfg.IdleFlush && now.Sub(r.bufferedSince) < r.cfg.IdleFlush {
		return
	}
	r.flushOnce()
}

// flushUntil flushes the chain until it is done or the deadline passes
// (what stays parked is abandoned by the chain's teardown and replays).
func (r *runner) flushUntil(deadline time.Time) {
	if r.chain == nil {
		return
	}
	for {
		r.health.beat(r.i)
		out := r.safeFlush()
		switch out.Kind {
		case pushDone:
			r.flushedSinceData = true
			return
		case pushFatal:
			r.reportFatal(out.Err)
			return
		}
		if out.Reason == blockCapacity {
			r.bp.onSendRejected()
		}
		if !time.Now().Before(deadline) {
			r.log.Error("flush did not finish before the drain deadline; parked records are abandoned and replay")
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// parkUntilShutdown keeps a failed runner answering control messages until
// Shutdown, because the shutdown barrier counts every runner.
func (r *runner) parkUntilShutdown() {
	for {
		r.health.beat(r.i)
		msg, ok := r.parked, r.parked != nil
		r.parked = nil
		if !ok {
			var m controlMsg
			m, ok = r.ctl.PopWait(50 * time.Millisecond)
			msg = &m
		}
		if !ok {
			continue
		}
		switch msg.kind {
		case ctlAddLane:
			// dropped: nothing polls on a failed thread
		case ctlStopLanes:
			n := r.removeLanes(msg.lanes)
			for range n {
				msg.barrier.Arrive()
			}
		case ctlDropLanes:
			r.removeLanes(msg.lanes)
		case ctlShutdown:
			r.lanes = nil
			msg.barrier.Arrive()
			return
		}
	}
}

func (r *runner) String() string { return fmt.Sprintf("runner-%d", r.i) }
