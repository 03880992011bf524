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
	gate     *PendingGate
	lanes    []LaneID
	barrier  *DrainBarrier
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
	chain       Chain
	bp          *watermarkController
	budget      *InflightBudget
	queuesBelow func(float64) bool
	health      *HealthState
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

func (d *runner) run() (exit runnerExit) {
	defer func() {
		if r := recover(); r != nil {
			// The shutdown barrier counts this runner: report, then keep
			// answering control messages until Shutdown like any failed one.
			fe := fatalf(d.component, "pipeline thread panicked outside the batch guard: %v", r)
			exit = runnerExit{failed: true, panic: fe}
			d.events.Push(runnerEvent{kind: evFatal, thread: d.i, err: fe})
			func() {
				defer func() { _ = recover() }()
				if d.chain != nil {
					d.chain.Close()
				}
			}()
			d.chain = nil
			d.parkUntilShutdown()
		}
	}()
	d.lastData = time.Now()
	d.flushedSinceData = true
	for {
		d.health.beat(d.i)
		if d.serveControl() {
			return runnerExit{}
		}
		if d.fatal {
			if d.chain != nil {
				d.chain.Close()
				d.chain = nil
			}
			d.parkUntilShutdown()
			return runnerExit{failed: true}
		}
		if d.backpressureTick() {
			time.Sleep(d.cfg.PollTimeout)
			continue
		}
		if len(d.lanes) == 0 {
			d.parkControl()
			d.idleFlush()
			continue
		}
		idx := d.nextLane % len(d.lanes)
		d.nextLane++
		lane := d.lanes[idx]
		timeout := time.Duration(0)
		if d.emptyPolls >= len(d.lanes) {
			timeout = d.cfg.PollTimeout
		}
		if d.isGated(lane) {
			d.gatedStreak++
			if d.gatedStreak >= len(d.lanes) {
				d.gatedStreak = 0
				d.parkControl()
				d.idleFlush()
			}
			continue
		}
		d.gatedStreak = 0
		start := time.Now()
		batch, err := lane.Poll(d.cfg.MaxRecords, timeout)
		end := time.Now()
		d.m.poll.Observe(end.Sub(start).Seconds())
		switch {
		case err != nil && isFatal(err):
			if batch != nil && batch.Ack != nil {
				batch.Ack.Abandon()
			}
			d.reportFatal(fatalf(d.component, "source poll failed: %v", err))
		case err != nil:
			if batch != nil && batch.Ack != nil {
				batch.Ack.Abandon()
			}
			d.emptyPolls++
			if time.Since(d.lastPollWarn) > 10*time.Second {
				d.lastPollWarn = time.Now()
				d.log.Warn("lane poll failed; polling it again later", "lane", lane.ID(), "error", err)
			}
		case batch == nil:
			d.emptyPolls++
			d.idleFlush()
		default:
			d.emptyPolls = 0
			d.lastData = end
			if d.flushedSinceData {
				d.bufferedSince = end
			}
			d.flushedSinceData = false
			d.onBatch(batch)
			d.idleFlush()
		}
	}
}

// onBatch counts, gates and drives one polled batch, then releases the
// runtime's reference to its acknowledgment.
func (d *runner) onBatch(b *Batch) {
	if b.Ack == nil {
		d.reportFatal(fatalf(d.component, "lane returned a batch without an acknowledgment handle"))
		return
	}
	var bytes int
	for i := range b.Payloads {
		bytes += len(b.Payloads[i].Value) + len(b.Payloads[i].Key)
	}
	if g := d.gates[b.Ack.ID().Partition]; g != nil && g.epoch == b.Ack.ID().Epoch {
		g.issued = max(g.issued, b.Ack.ID().Seq+1)
		g.polled(b.Ack.ID().Seq, int64(bytes))
	}
	d.m.records.Add(float64(len(b.Payloads)))
	d.m.bytes.Add(float64(bytes))
	if err := d.runBatch(b); err != nil {
		d.reportFatal(err)
	}
	b.Ack.Release()
}

// runBatch pushes b until the chain takes all of it. Every way out but
// success fails the batch's acknowledgment.
func (d *runner) runBatch(b *Batch) (fe *FatalError) {
	defer func() {
		if r := recover(); r != nil {
			b.Ack.Fail()
			fe = fatalf(d.component, "operator chain panicked: %v", r)
		}
	}()
	from := 0
	waiter, _ := d.chain.(roomWaiter)
	var blockedSince time.Time
	for retry := false; ; retry = true {
		if retry {
			d.health.beat(d.i) // the poll loop beat just before the first push
		}
		out := d.chain.PushBatch(b, from)
		switch out.Kind {
		case PushDone:
			return nil
		case PushFatal:
			b.Ack.Fail()
			if out.Err == nil {
				return fatalf(d.component, "operator chain failed")
			}
			return out.Err
		}
		from = max(from, out.ResumeAt)
		if d.shutdown.Load() {
			d.log.Warn("abandoning a blocked batch for the shutdown; it replays", "batch", b.Ack.ID())
			b.Ack.Fail()
			d.chain.AbandonBatch()
			return nil
		}
		if out.Reason != BlockCapacity {
			time.Sleep(d.cfg.BlockedRetry)
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
		if waiter == nil || now.Sub(blockedSince) >= d.cfg.BlockGrace {
			d.bp.onSendRejected()
			d.applyTransition(d.bp.tick(d.budget.Usage(), d.queuesBelow(d.cfg.LowRatio)))
		}
		if waiter != nil {
			waiter.waitRoom(d.cfg.BlockedRetry)
		} else {
			time.Sleep(d.cfg.BlockedRetry)
		}
	}
}

func (d *runner) reportFatal(err *FatalError) {
	d.fatal = true
	d.events.Push(runnerEvent{kind: evFatal, thread: d.i, err: err})
}

// serveControl handles the parked message and every queued one. It
// reports whether the runner must exit (Shutdown).
func (d *runner) serveControl() bool {
	if d.parked != nil {
		msg := *d.parked
		d.parked = nil
		if d.handle(msg) {
			return true
		}
	}
	for {
		msg, ok := d.ctl.TryPop()
		if !ok {
			return false
		}
		if d.handle(msg) {
			return true
		}
	}
}

func (d *runner) handle(msg controlMsg) bool {
	switch msg.kind {
	case ctlAddLane:
		d.lanes = append(d.lanes, msg.lane)
		p := msg.lane.Partition()
		if msg.gate != nil {
			if g := d.gates[p]; g == nil || g.epoch < msg.gate.Epoch {
				d.gates[p] = &gateState{epoch: msg.gate.Epoch, advanced: msg.gate.Advanced, committed: msg.gate.Committed}
			}
		}
	case ctlStopLanes:
		n := d.removeLanes(msg.lanes)
		if n > 0 {
			d.flushUntil(msg.deadline)
		}
		for range n {
			msg.barrier.Arrive()
		}
	case ctlFlushNow:
		d.flushOnce()
	case ctlDropLanes:
		d.removeLanes(msg.lanes)
	case ctlShutdown:
		d.flushUntil(msg.deadline)
		d.lanes = nil
		clear(d.gates)
		if d.chain != nil {
			d.chain.Close()
			d.chain = nil
		}
		msg.barrier.Arrive()
		return true
	}
	return false
}

// removeLanes drops the listed lanes it holds and the gates of partitions
// it no longer has lanes for; it returns how many it removed.
func (d *runner) removeLanes(ids []LaneID) int {
	n := 0
	d.lanes = slices.DeleteFunc(d.lanes, func(l Lane) bool {
		if slices.Contains(ids, l.ID()) {
			n++
			return true
		}
		return false
	})
	for p := range d.gates {
		if !slices.ContainsFunc(d.lanes, func(l Lane) bool { return l.Partition() == p }) {
			delete(d.gates, p)
		}
	}
	return n
}

func (d *runner) isGated(l Lane) bool {
	g := d.gates[l.Partition()]
	if g == nil {
		return false
	}
	adv := g.advanced.Load()
	pending := uint64(0)
	if g.issued > adv {
		pending = g.issued - adv
	}
	gated := pending >= uint64(d.cfg.MaxPendingBatches)
	if gated && !g.gated {
		if time.Since(g.lastWarn) > 10*time.Second {
			g.lastWarn = time.Now()
			d.log.Warn("partition at its pending-batch ceiling; not polling it until its watermark advances",
				"partition", l.Partition(), "pending", pending, "ceiling", d.cfg.MaxPendingBatches)
		}
	} else if !gated && g.gated {
		d.log.Debug("partition below its pending-batch ceiling again", "partition", l.Partition())
	}
	g.gated = gated
	return d.bytesGated(l.Partition(), g) || gated
}

// bytesGated applies the uncommitted-bytes ceiling to g, asking the
// controller for a commit when the partition reaches it.
func (d *runner) bytesGated(p PartitionID, g *gateState) bool {
	limit := d.cfg.MaxUncommittedBytes
	if limit <= 0 || g.committed == nil {
		return false
	}
	n := g.settle()
	if n > 0 && n < limit && d.commitsFailing != nil && d.commitsFailing.Load() {
		// Commits are not landing: what is read now cannot be committed
		// and replays if the leases run out. The controller retries its
		// commit every tick; asking for more would only hammer the store.
		return true
	}
	gated := n >= limit
	if gated && time.Since(g.lastWant) >= d.cfg.EventPollTimeout {
		// Repeated while gated: the commit that lands may not cover it all.
		g.lastWant = time.Now()
		d.events.Push(runnerEvent{kind: evCommitWanted, thread: d.i, partitions: []PartitionID{p}})
	}
	if gated && !g.bytesGated {
		// One line per runner and interval, not per partition: a store
		// refusing commits gates every partition at about the same time.
		if ok, suppressed := d.bytesWarn.allow(time.Now(), commitWarnEvery); ok {
			d.log.Warn("partition at its uncommitted-bytes ceiling; not polling it until a commit lands",
				"partition", p, "uncommitted_bytes", n, "ceiling", limit, "suppressed_warnings", suppressed)
		}
	} else if !gated && g.bytesGated {
		d.log.Debug("partition below its uncommitted-bytes ceiling again", "partition", p)
	}
	g.bytesGated = gated
	return gated
}

// parkControl waits on the control queue for up to the poll timeout,
// keeping any message for the next serveControl.
func (d *runner) parkControl() {
	if msg, ok := d.ctl.PopWait(d.cfg.PollTimeout); ok {
		d.parked = &msg
	}
}

// backpressureTick applies a transition and reports whether the runner is
// paused.
func (d *runner) backpressureTick() bool {
	d.applyTransition(d.bp.tick(d.budget.Usage(), d.queuesBelow(d.cfg.LowRatio)))
	return d.bp.paused
}

func (d *runner) applyTransition(t bpTransition) {
	switch t {
	case bpPause:
		d.pauseStarted = time.Now()
		d.m.paused.Set(1)
		d.m.pauseEvents.Inc()
		d.events.Push(runnerEvent{kind: evPause, thread: d.i, lanes: d.laneIDs()})
	case bpResume:
		d.m.paused.Set(0)
		d.m.pausedSeconds.Add(time.Since(d.pauseStarted).Seconds())
		d.events.Push(runnerEvent{kind: evResume, thread: d.i, lanes: d.laneIDs()})
	}
}

func (d *runner) laneIDs() []LaneID {
	ids := make([]LaneID, len(d.lanes))
	for i, l := range d.lanes {
		ids[i] = l.ID()
	}
	return ids
}

func (d *runner) flushOnce() {
	if d.chain == nil {
		return
	}
	out := d.safeFlush()
	switch out.Kind {
	case PushDone:
		d.flushedSinceData = true
	case PushBlocked:
		if out.Reason == BlockCapacity {
			d.bp.onSendRejected()
		}
	case PushFatal:
		d.reportFatal(out.Err)
	}
}

func (d *runner) safeFlush() (out PushOutcome) {
	defer func() {
		if r := recover(); r != nil {
			out = PushOutcome{Kind: PushFatal, Err: fatalf(d.component, "operator chain panicked: %v", r)}
		}
	}()
	out = d.chain.Flush()
	if out.Kind == PushFatal && out.Err == nil {
		out.Err = fatalf(d.component, "operator chain flush failed")
	}
	return out
}

// idleFlush flushes the chain once its data has been idle for IdleFlush,
// or has waited that long in its buffers: a trickle of records (a
// followed file) is then never held until the next commit tick, which
// would put a whole commit interval into its latency.
func (d *runner) idleFlush() {
	if d.flushedSinceData {
		return
	}
	if now := time.Now(); now.Sub(d.lastData) < d.cfg.IdleFlush && now.Sub(d.bufferedSince) < d.cfg.IdleFlush {
		return
	}
	d.flushOnce()
}

// flushUntil flushes the chain until it is done or the deadline passes
// (what stays parked is abandoned by the chain's teardown and replays).
func (d *runner) flushUntil(deadline time.Time) {
	if d.chain == nil {
		return
	}
	for {
		d.health.beat(d.i)
		out := d.safeFlush()
		switch out.Kind {
		case PushDone:
			d.flushedSinceData = true
			return
		case PushFatal:
			d.reportFatal(out.Err)
			return
		}
		if out.Reason == BlockCapacity {
			d.bp.onSendRejected()
		}
		if !time.Now().Before(deadline) {
			d.log.Error("flush did not finish before the drain deadline; parked records are abandoned and replay")
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// parkUntilShutdown keeps a failed runner answering control messages until
// Shutdown, because the shutdown barrier counts every runner.
func (d *runner) parkUntilShutdown() {
	for {
		d.health.beat(d.i)
		msg, ok := d.parked, d.parked != nil
		d.parked = nil
		if !ok {
			var m controlMsg
			m, ok = d.ctl.PopWait(50 * time.Millisecond)
			msg = &m
		}
		if !ok {
			continue
		}
		switch msg.kind {
		case ctlAddLane:
			// dropped: nothing polls on a failed thread
		case ctlStopLanes:
			n := d.removeLanes(msg.lanes)
			for range n {
				msg.barrier.Arrive()
			}
		case ctlDropLanes:
			d.removeLanes(msg.lanes)
		case ctlShutdown:
			d.lanes = nil
			msg.barrier.Arrive()
			return
		}
	}
}

func (d *runner) String() string { return fmt.Sprintf("runner-%d", d.i) }
