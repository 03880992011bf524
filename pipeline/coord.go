package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// SplitOpening is what a [SplitSource] gets to build the lane of one split
// tenancy.
type SplitOpening struct {
	// Spec is the split, descriptor included.
	Spec spate.SplitSpec
	// Progress is the validated progress to resume from (nil: from the
	// start).
	Progress *spate.SplitProgress
	// Lane and Partition are fresh ids, never reused.
	Lane      LaneID
	Partition PartitionID
	// Epoch is the tenancy's fencing token.
	Epoch spate.LeaseEpoch
	// Issuer is this tenancy's own acknowledgment issuer.
	Issuer *AckIssuer
	// Waker wakes the coordination driver's control wait: signal it when the
	// lane decides end of input (after making that visible to
	// TakeFinishing).
	Waker spate.Waker
	// Poison reports the split unprocessable (it wakes the coordination
	// driver, which fails the split through the coordinator and revokes the
	// lane).
	Poison func(reason string)
}

// SplitSource is what a coordinated source implements for the
// [CoordinationDriver]. All methods are called from the controller
// goroutine; lanes run on the runtime's runner goroutines, so state shared with them
// needs locking. Embed [BaseSplitSource] for the optional methods, and
// implement [StopReader] if a lane can read on through a graceful stop.
// examples/rangescan is a complete one in about 135 lines.
type SplitSource interface {
	// OpenSplit builds the lane of a tenancy. It must not block.
	OpenSplit(o SplitOpening) (Lane, error)
	// ValidateResume checks carried progress for drift. A rejection means
	// the split is never opened: the coordination driver reports it as
	// poison. A Fatal rejection stops the pipeline; any other class does
	// not.
	ValidateResume(spec spate.SplitSpec, p spate.SplitProgress) error
	// EncodeCommit snapshots the split's progress at an acknowledged,
	// split-relative watermark, and says whether that completes the split
	// (everything read, delivered and acknowledged).
	EncodeCommit(split spate.SplitID, watermark int64) (spate.SplitProgress, error)
	// Sweep is asked about live splits that got no new watermark: it
	// returns terminal progress once the split is complete (an empty split,
	// a tail acknowledged at the last commit), progress whose Parked
	// differs from the last commit's (a followed file went idle, or grew
	// again), else nil.
	Sweep(split spate.SplitID) (*spate.SplitProgress, error)
	// CloseSplit ends a tenancy: detach, never block. No EncodeCommit or
	// Sweep follows for that tenancy.
	CloseSplit(split spate.SplitID)
	// TakeFinishing returns the splits whose lanes decided end of input
	// since the last call: a latency hint, which has their partitions
	// committed promptly rather than at the next commit tick.
	TakeFinishing() []spate.SplitID
	// BeginRevoke is asked once when the coordinator wants the split back (a
	// rebalance). True drains it: the coordination driver stops polling the
	// split's lane at the next batch boundary, waits until every record the
	// lane emitted is acknowledged, commits that watermark (EncodeCommit,
	// which may report completion) and hands the split back, so the next
	// owner reads nothing twice. Return false only when the source cannot
	// stop between two batches: the coordinator then forces the hand-back
	// and the uncommitted tail is read again by the next owner (duplicates
	// for an at-least-once sink). [BaseSplitSource] drains.
	BeginRevoke(split spate.SplitID) bool
}

// PlanFinalizer is implemented by split sources whose splits follow growing
// input (a file tail) and so cannot end on their own: the coordination
// driver calls PlanFinalized once the job's plan is final, and from then on
// the source completes each split at the end of its input.
type PlanFinalizer interface {
	PlanFinalized()
}

// BaseSplitSource supplies the optional methods' defaults: accept every
// resume, no finishing hints, and drain every revocation (see
// [SplitSource.BeginRevoke]).
type BaseSplitSource struct{}

func (BaseSplitSource) ValidateResume(spate.SplitSpec, spate.SplitProgress) error { return nil }
func (BaseSplitSource) TakeFinishing() []spate.SplitID                            { return nil }
func (BaseSplitSource) BeginRevoke(spate.SplitID) bool                            { return true }

type tenancyState uint8

const (
	tenancyLive tenancyState = iota
	tenancyDraining
	tenancyRetired
)

// tenancy is one unbroken ownership span of one split.
type tenancy struct {
	spec      spate.SplitSpec
	epoch     spate.LeaseEpoch
	partition PartitionID
	lane      LaneID
	opened    bool
	state     tenancyState
	fenced    bool
	completed bool
	handedOff bool
	// stageOpen: the staging sink holds an open stage for the tenancy.
	stageOpen bool
	// stageFails counts the OpenStage calls in a row that failed
	// transiently; stageRetryAt is when the next one is due (zero: now).
	stageFails   int
	stageRetryAt time.Time
	// unpublished is the committable of a won commit whose publish
	// failed; it is published again on the next poll.
	unpublished []byte
	// completing is terminal progress held back until what the split's
	// output lists is published: a completed split is never opened again,
	// so nobody would finish a publish its completion left pending.
	completing *spate.SplitProgress
	// noSpace counts publishes that failed on a full destination.
	noSpace int
	// outputDamaged is set once a publish found the published output
	// damaged ([ErrOutputDamaged]): the split is being set aside, and is
	// not published again.
	outputDamaged bool
	// gate is the lane as the runtime polls it: the coordination driver
	// stops it to drain a revocation (drain.go).
	gate *gatedLane
	// acked is the highest acknowledged watermark handed to Commit; won
	// the watermark of the last commit that landed (both start at the
	// resume watermark).
	acked, won int64
	// short is the watermark of a commit whose sink covered less of it
	// (a part not rolled yet); shortAt when it was tried. The sweep tries
	// it again, so that the rest is committed once the sink rolls it, even
	// if no new data ever advances the watermark (a followed file gone
	// quiet).
	short   int64
	shortAt time.Time
	// tried is the highest watermark a commit of the tenancy carried to
	// the coordinator. A commit that reported a failure (a timeout, a lost
	// reply) may still have landed, and the sink's committable covers it
	// from then on: no later commit of the tenancy goes below it, or the
	// coordinator would take it for a watermark moved back (Fatal), and
	// one that landed would list output its watermark does not cover.
	tried int64
	// releasing: the tenancy is being handed back (Release): its commit is
	// final, so a sink rolling parts covers all that was acknowledged.
	releasing bool
	// progress is the resume cache: the Gained carry, then every
	// acknowledged commit (even a deferred one: acknowledged data is
	// durable in the sink, so resuming past it loses nothing).
	progress *spate.SplitProgress
}

type poisonReport struct {
	split  spate.SplitID
	reason string
}

// DriverOption configures a [CoordinationDriver].
type DriverOption func(*driverOptions)

type driverOptions struct {
	stallDrains bool
	opTimeout   time.Duration
	log         *slog.Logger
}

// StallDrains makes a Stalled job drain the pipeline (with a warning)
// instead of failing it. Default false: Stalled is fatal.
func StallDrains(v bool) DriverOption { return func(o *driverOptions) { o.stallDrains = v } }

// driverOpTimeout bounds each coordinator call the coordination driver
// makes. Default 30s.
func driverOpTimeout(d time.Duration) DriverOption {
	return func(o *driverOptions) { o.opTimeout = d }
}

// DriverLogger sets the coordination driver's logger.
func DriverLogger(l *slog.Logger) DriverOption { return func(o *driverOptions) { o.log = l } }

// CoordinationDriver turns a [spate.SplitCoordinator]'s ownership events
// into the runtime's lane events for a [SplitSource]. It is synchronous
// and used from the controller goroutine only (except [ReportPoison]).
//
// Every tenancy gets a fresh partition id and lane id. Gains add lanes,
// involuntary losses and fences revoke them (with a drain barrier),
// completed or drained hand-backs retire them, end-of-input hints tighten
// the commit cadence, AllComplete drains the pipeline, and Stalled is a
// fatal error (or a drain, see [StallDrains]).
type CoordinationDriver[C spate.SplitCoordinator] struct {
	coord  C
	waker  spate.Waker
	opts   driverOptions
	issuer *AckIssuer
	stop   *stopSignal
	// stage, when set, is the staging sink whose committables ride in
	// the commits (exactly-once output).
	stage StagingSink

	nextPartition uint32
	nextLane      uint32
	held          map[spate.SplitID]*tenancy
	byPartition   map[PartitionID]*tenancy
	staged        []*tenancy
	lost          []LaneID
	retired       []LaneID
	retiredSet    []*tenancy    // retired tenancies kept until their lane event is delivered
	chase         []PartitionID // draining partitions to commit promptly
	allComplete   bool
	stagesCleaned bool // the staging sink's CleanJob ran (see StageCleaner)
	stalled       *spate.Stalled
	everHeld      bool
	refused       []poisonReport

	poisonMu sync.Mutex
	poison   []poisonReport

	// commitMu serializes what the concurrent commits of one Commit call
	// share: the coordination driver's tenancy sets (retire), the deferred
	// list, and the source (EncodeCommit, CloseSplit), which need not be
	// safe for concurrent use.
	commitMu sync.Mutex

	// deferred lists the partitions whose commit the running Commit call
	// deferred (collecting is set only during Commit), and why.
	collecting  bool
	deferred    []PartitionID
	deferredErr error
}

// NewCoordinationDriver wraps coord and hands it the coordination driver's
// waker.
func NewCoordinationDriver[C spate.SplitCoordinator](coord C, opts ...DriverOption) *CoordinationDriver[C] {
	o := driverOptions{opTimeout: 30 * time.Second, log: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	d := &CoordinationDriver[C]{
		coord:       coord,
		waker:       spate.NewWaker(),
		opts:        o,
		held:        map[spate.SplitID]*tenancy{},
		byPartition: map[PartitionID]*tenancy{},
	}
	coord.SetWaker(d.waker)
	return d
}

// StageOutput makes the coordination driver's commits carry sink's
// committable and publish it once they win (see [StagingSink]). Call it
// before the first poll.
func (d *CoordinationDriver[C]) StageOutput(sink StagingSink) error {
	if sink == nil {
		return errors.New("pipeline: StageOutput: nil sink")
	}
	if d.stage != nil && d.stage != sink {
		return errors.New("pipeline: StageOutput: the coordination driver already stages into another sink; a commit carries one committable")
	}
	if len(d.held) > 0 {
		return errors.New("pipeline: StageOutput: called after splits were gained; wire the sink before the first poll")
	}
	d.stage = sink
	return nil
}

// Coordinator returns the wrapped coordinator.
func (d *CoordinationDriver[C]) Coordinator() C { return d.coord }

// Waker is the coordination driver's control-plane waker.
func (d *CoordinationDriver[C]) Waker() spate.Waker { return d.waker }

// Open takes the runtime's issuer and stop signal (call from Source.Open).
func (d *CoordinationDriver[C]) Open(ctx SourceCtx) {
	d.issuer = ctx.Issuer
	d.stop = ctx.Stop
}

// Start starts the coordinator with planner and returns the empty
// assignment (the ready signal), which the source must return from the same
// PollEvents call.
func (d *CoordinationDriver[C]) Start(planner spate.SplitPlanner) (sourceEvent, error) {
	if err := d.coord.Start(planner); err != nil {
		return sourceEvent{}, err
	}
	return assignedEvent(), nil
}

func (d *CoordinationDriver[C]) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d.opts.opTimeout)
}

// ReportPoison queues a poison report for split from any goroutine and
// wakes the coordination driver, which fails the split on its next poll.
func (d *CoordinationDriver[C]) ReportPoison(split spate.SplitID, reason string) {
	d.poisonMu.Lock()
	d.poison = append(d.poison, poisonReport{split: split, reason: reason})
	d.poisonMu.Unlock()
	d.waker.Wake()
}

// splitAssignment is one held split and its lane.
type splitAssignment struct {
	Split     spate.SplitID
	Partition PartitionID
	Lane      LaneID
	Draining  bool
}

// Assignments lists the held splits, sorted by id.
func (d *CoordinationDriver[C]) Assignments() []splitAssignment {
	out := make([]splitAssignment, 0, len(d.held))
	for id, t := range d.held {
		out = append(out, splitAssignment{Split: id, Partition: t.partition, Lane: t.lane, Draining: t.state == tenancyDraining})
	}
	slices.SortFunc(out, func(a, b splitAssignment) int { return a.Split.Compare(b.Split) })
	return out
}

// PollEvents returns at most one runtime event, in priority order: losses
// (lanes revoked), retirements (lanes retired), gains (lanes added), a
// terminal job state (drained, or the Stalled error), then end-of-input
// hints; otherwise it parks on the waker for up to timeout and returns an
// idle event.
func (d *CoordinationDriver[C]) PollEvents(src SplitSource, timeout time.Duration) (sourceEvent, error) {
	d.takePoison(src)
	for {
		if len(d.lost) > 0 {
			lanes := d.lost
			d.lost = nil
			ev, _ := revokedEvent(lanes...)
			return ev, nil
		}
		if len(d.retired) > 0 {
			lanes := d.retired
			d.retired = nil
			return retiredEvent(lanes...), nil
		}
		// Retired tenancies' lane events were delivered: stop absorbing
		// their late watermarks.
		for _, t := range d.retiredSet {
			delete(d.byPartition, t.partition)
		}
		d.retiredSet = nil
		if len(d.staged) > 0 && (d.stop.Stopping() || d.stagedDue(time.Now())) {
			if d.stop.Stopping() {
				d.handBackStaged()
			} else {
				lanes, err := d.openStaged(src)
				if err != nil {
					return sourceEvent{}, err
				}
				return addedEvent(lanes...), nil
			}
		}
		if d.stalled != nil {
			if d.opts.stallDrains {
				d.opts.log.Warn("the job stalled: some splits are quarantined or their records damaged; draining as configured",
					"completed", d.stalled.Completed, "quarantined", d.stalled.Quarantined, "damaged", d.stalled.Damaged)
				return drainedEvent(), nil
			}
			if len(d.stalled.Damaged) > 0 {
				return sourceEvent{}, spate.Fatalf("coordinated job stalled: %d splits completed, %d quarantined, %d out of play because a record is damaged (%s; the coordinator's log names each key and its fix)",
					d.stalled.Completed, d.stalled.Quarantined, len(d.stalled.Damaged), strings.Join(d.stalled.Damaged, ", "))
			}
			return sourceEvent{}, spate.Fatalf("coordinated job stalled: %d splits completed, %d quarantined (see spate_coordination_splits_quarantined); requeue or fix the quarantined splits",
				d.stalled.Completed, d.stalled.Quarantined)
		}
		if d.allComplete {
			d.cleanStages()
			return drainedEvent(), nil
		}
		d.reofferPoison()

		events, pollErr := d.coord.Poll()
		var applyErr error
		for _, ev := range events {
			if err := d.apply(src, ev); err != nil {
				applyErr = pickError(applyErr, err)
			}
		}
		if pollErr != nil {
			applyErr = pickError(applyErr, pollErr)
		}
		if err := d.sweep(src); err != nil {
			applyErr = pickError(applyErr, err)
		}
		if err := d.advanceDrains(src); err != nil {
			applyErr = pickError(applyErr, err)
		}
		if applyErr != nil {
			return sourceEvent{}, applyErr
		}
		if len(d.lost) > 0 || len(d.retired) > 0 || d.stagedDue(time.Now()) || d.stalled != nil || d.allComplete {
			continue
		}
		break
	}
	// A draining split's drain ends at a commit of all it emitted: it is
	// chased like a finishing one, not left to the tick.
	parts := d.chase
	d.chase = nil
	for _, s := range src.TakeFinishing() {
		if t := d.held[s]; t != nil && (t.state == tenancyLive || t.state == tenancyDraining) && !t.fenced {
			parts = append(parts, t.partition)
		}
	}
	if len(parts) > 0 {
		return commitReadyEvent(parts...), nil
	}
	if due, ok := d.nextStageRetry(); ok {
		timeout = min(timeout, max(time.Until(due), 0))
	}
	if timeout > 0 {
		t := time.NewTimer(timeout)
		select {
		case <-d.waker.C():
		case <-t.C:
		}
		t.Stop()
	}
	return idleEvent(), nil
}

// pickError keeps the first error unless a later one is Fatal: a Fatal
// must not hide behind a Retryable.
func pickError(cur, next error) error {
	if cur == nil {
		return next
	}
	if !isFatal(cur) && isFatal(next) {
		return next
	}
	return cur
}

func (d *CoordinationDriver[C]) takePoison(src SplitSource) {
	d.poisonMu.Lock()
	reports := d.poison
	d.poison = nil
	d.poisonMu.Unlock()
	for _, r := range reports {
		if err := d.Fail(src, r.split, r.reason); err != nil {
			d.opts.log.Warn("poison report failed; it is retried", "split", r.split, "error", err)
			d.refused = append(d.refused, r)
		}
	}
}

// reofferPoison retries poison reports the coordinator refused earlier.
func (d *CoordinationDriver[C]) reofferPoison() {
	var still []poisonReport
	for _, r := range d.refused {
		ctx, cancel := d.ctx()
		err := d.coord.Fail(ctx, r.split, r.reason)
		cancel()
		if err != nil && !errors.Is(err, spate.ErrFenced) {
			still = append(still, r)
		}
	}
	d.refused = still
}

// openStaged opens every staged tenancy or none: a failure closes the
// lanes built so far, burns their ids and keeps the batch staged.
func (d *CoordinationDriver[C]) openStaged(src SplitSource) ([]Lane, error) {
	var lanes []Lane
	var opened []*tenancy
	if err := d.openStages(); err != nil {
		return nil, err
	}
	var waiting []*tenancy
	for _, t := range d.staged {
		if !t.stageOpen && d.stage != nil {
			waiting = append(waiting, t) // its stage opens at a later poll
			continue
		}
		t.lane = LaneID(d.nextLane)
		d.nextLane++
		var issuer *AckIssuer
		if d.issuer != nil {
			issuer = d.issuer.Clone()
		}
		split := t.spec.ID
		lane, err := src.OpenSplit(SplitOpening{
			Spec: t.spec, Progress: t.progress, Lane: t.lane, Partition: t.partition, Epoch: t.epoch,
			Issuer: issuer, Waker: d.waker,
			Poison: func(reason string) { d.ReportPoison(split, reason) },
		})
		if err != nil {
			for _, o := range opened {
				src.CloseSplit(o.spec.ID)
				o.opened = false
			}
			d.closeStages(d.staged)
			return nil, fmt.Errorf("open split %s: %w", t.spec.ID, err)
		}
		t.opened = true
		var from int64
		if t.progress != nil {
			from = t.progress.Watermark
		}
		t.gate = newGatedLane(lane, from)
		t.acked, t.won = from, from
		opened = append(opened, t)
		lanes = append(lanes, t.gate)
	}
	d.staged = waiting
	return lanes, nil
}

// handBackStaged releases staged gains during a graceful stop instead of
// opening lanes that would only read briefly.
func (d *CoordinationDriver[C]) handBackStaged() {
	ids := make([]spate.SplitID, 0, len(d.staged))
	for _, t := range d.staged {
		ids = append(ids, t.spec.ID)
		delete(d.held, t.spec.ID)
		delete(d.byPartition, t.partition)
	}
	d.staged = nil
	ctx, cancel := d.ctx()
	defer cancel()
	if err := d.coord.Release(ctx, ids...); err != nil {
		d.opts.log.Warn("could not hand back splits gained during the stop; their leases expire", "error", err)
	}
}

func (d *CoordinationDriver[C]) apply(src SplitSource, ev spate.Event) error {
	switch e := ev.(type) {
	case spate.Gained:
		if old := d.held[e.Split.ID]; old != nil {
			d.opts.log.Warn("gained a split already held; retiring the stale tenancy", "split", e.Split.ID)
			d.retire(src, old, false)
		}
		if e.Progress != nil {
			if err := src.ValidateResume(e.Split, *e.Progress); err != nil {
				reason := fmt.Sprintf("resume progress rejected: %v", err)
				ctx, cancel := d.ctx()
				ferr := d.coord.Fail(ctx, e.Split.ID, reason)
				cancel()
				if ferr != nil && !errors.Is(ferr, spate.ErrFenced) {
					d.refused = append(d.refused, poisonReport{split: e.Split.ID, reason: reason})
					d.opts.log.Warn("the split's resume progress was rejected; reporting it failed is retried", "split", e.Split.ID, "reason", reason, "error", ferr)
				}
				if isFatal(err) {
					return fmt.Errorf("split %s: %w", e.Split.ID, err)
				}
				// Only the split is rejected, and the coordinator's
				// failure report (its log line names the reason) is the
				// one word on it: returned, the error would be logged
				// again as a control-plane fault of the source.
				return nil
			}
		}
		d.everHeld = true
		t := &tenancy{spec: e.Split, epoch: e.Epoch, partition: PartitionID(d.nextPartition), progress: e.Progress}
		d.nextPartition++
		d.held[e.Split.ID] = t
		d.byPartition[t.partition] = t
		d.staged = append(d.staged, t)
	case spate.RevokeRequested:
		t := d.held[e.Split]
		if t == nil {
			return nil // not held: a no-op
		}
		if t.state == tenancyDraining && !t.fenced {
			return nil // already draining
		}
		if !t.opened && t.stageFails > 0 && slices.Contains(d.staged, t) {
			// Still waiting for its stage (a transient fault): nothing
			// was read, so it is handed back at once.
			d.staged = slices.DeleteFunc(d.staged, func(s *tenancy) bool { return s == t })
			delete(d.held, t.spec.ID)
			delete(d.byPartition, t.partition)
			ctx, cancel := d.ctx()
			defer cancel()
			if err := d.coord.Release(ctx, t.spec.ID); err != nil {
				d.opts.log.Warn("could not hand back a split whose stage had not opened; its lease expires", "split", t.spec.ID, "error", err)
			}
			return nil
		}
		if d.beginDrain(src, t) {
			return nil
		}
		ctx, cancel := d.ctx()
		defer cancel()
		if err := d.coord.DeclineRevoke(ctx, e.Split); err != nil {
			d.opts.log.Warn("decline of a revocation failed; the coordinator forces it at its deadline", "split", e.Split, "error", err)
		}
	case spate.DivideRequested:
		d.divideAsked(src, e.Split, e.Pieces)
	case spate.Lost:
		if t := d.held[e.Split]; t != nil {
			d.retire(src, t, false)
		}
	case spate.Quarantined:
		d.opts.log.Warn("split quarantined", "split", e.Split, "attempts", e.Attempts)
		if t := d.held[e.Split]; t != nil {
			d.retire(src, t, false)
		}
	case spate.PlanFinalized:
		if f, ok := src.(PlanFinalizer); ok {
			f.PlanFinalized()
		}
	case spate.AllComplete:
		if !d.allComplete && !d.everHeld {
			d.opts.log.Info("the job finished before this instance held any split (it finished before this instance's first rebalance, or there are more replicas than splits)")
		}
		d.allComplete = true
	case spate.Stalled:
		d.stalled = &e
	}
	return nil
}

// retire ends a tenancy: its lane leaves barrier-less when the tenancy
// completed or was handed off, through a revocation otherwise.
func (d *CoordinationDriver[C]) retire(src SplitSource, t *tenancy, fenced bool) {
	t.state = tenancyRetired
	t.fenced = t.fenced || fenced
	delete(d.held, t.spec.ID)
	d.closeStages([]*tenancy{t})
	if i := slices.Index(d.staged, t); i >= 0 {
		d.staged = slices.Delete(d.staged, i, i+1)
	}
	if !t.opened {
		delete(d.byPartition, t.partition)
		return
	}
	if t.completed || t.handedOff {
		d.retired = append(d.retired, t.lane)
	} else {
		d.lost = append(d.lost, t.lane)
	}
	d.retiredSet = append(d.retiredSet, t)
	src.CloseSplit(t.spec.ID)
}

// Commit commits acknowledged watermarks (split-relative offsets) through
// the coordinator. Unknown, retired, fenced and completed tenancies are
// skipped: their data replays under the next owner or is already done. A
// retryable failure is deferred (the progress rides the split's next
// commit); only a Fatal error is returned.
func (d *CoordinationDriver[C]) Commit(src SplitSource, positions []Watermark) error {
	d.deferred, d.deferredErr, d.collecting = d.deferred[:0], nil, true
	defer func() { d.collecting = false }()
	type job struct {
		t *tenancy
		p spate.SplitProgress
	}
	var (
		jobs     []job
		firstErr error
	)
	for _, w := range positions {
		t := d.byPartition[w.Partition]
		if t == nil || t.state == tenancyRetired || t.fenced || t.completed {
			continue
		}
		t.acked = max(t.acked, w.Offset)
		p, err := src.EncodeCommit(t.spec.ID, w.Offset)
		if err != nil {
			firstErr = pickError(firstErr, fmt.Errorf("encode commit of split %s: %w", t.spec.ID, err))
			continue
		}
		jobs = append(jobs, job{t, p})
	}
	if len(jobs) == 1 {
		return pickError(firstErr, d.commitTenancy(src, jobs[0].t, jobs[0].p))
	}
	// The splits' commits are independent: each is a sink prepare, a
	// compare-and-swap, a publish and, for a completion, a second
	// compare-and-swap, each waiting on an fsync somewhere. Run one after
	// another, a worker's commits were its copy's bottleneck (8 lanes
	// finishing together waited 8 round trips each); run side by side,
	// they wait about one. One split's steps stay in order.
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, commitConcurrency)
	)
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := d.commitTenancy(src, j.t, j.p); err != nil {
				mu.Lock()
				firstErr = pickError(firstErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

// shortCommitRetry is how often the sweep tries again a commit that its
// sink covered only in part.
const shortCommitRetry = 100 * time.Millisecond

// commitConcurrency bounds the splits one Commit call commits at once.
const commitConcurrency = 16

// commitTenancy commits t's progress p: it prepares the staged output,
// compare-and-swaps the record, publishes and finishes a completion. It
// touches only t, except through commitMu: Commit runs it for several
// tenancies at once.
func (d *CoordinationDriver[C]) commitTenancy(src SplitSource, t *tenancy, p spate.SplitProgress) error {
	var complete *spate.SplitProgress
	if d.stage != nil && t.stageOpen {
		final := p.Completed || t.releasing || t.state == tenancyDraining && t.lastOfDrain(p.Watermark)
		out, covered, pending, err := d.prepare(t, p.Watermark, final)
		if err != nil {
			if errors.Is(err, spate.ErrFatal) {
				return err
			}
			return d.deferCommit(t, nil, err)
		}
		if covered < p.Watermark {
			// The sink rolls its output in parts and cut none this time:
			// commit what its parts cover (nothing, if no part was cut);
			// the sweep asks again for the rest.
			d.commitMu.Lock()
			t.short, t.shortAt = max(t.short, p.Watermark), time.Now()
			d.commitMu.Unlock()
			if covered <= t.won {
				return nil
			}
			d.commitMu.Lock()
			short, err := src.EncodeCommit(t.spec.ID, covered)
			d.commitMu.Unlock()
			if err != nil {
				return fmt.Errorf("encode commit of split %s: %w", t.spec.ID, err)
			}
			p = short
			p.Completed = false
		}
		p.Output = out
		if p.Completed && pending {
			// Completion waits until the output it covers is published.
			c := p
			complete = &c
			p.Completed = false
		}
	}
	t.tried = max(t.tried, p.Watermark)
	ctx, cancel := d.ctx()
	err := d.coord.CommitAt(ctx, t.spec.ID, t.epoch, p)
	cancel()
	switch {
	case err == nil:
		t.progress = &p
		t.won = max(t.won, p.Watermark)
		if p.Completed {
			t.completed = true
			d.commitMu.Lock()
			d.retire(src, t, false)
			d.commitMu.Unlock()
			return nil
		}
		if d.stage != nil && t.stageOpen {
			t.completing = complete
			if err := d.publish(t, p.Output); err != nil {
				return err
			}
			return d.finishCompletion(src, t)
		}
		return nil
	case errors.Is(err, spate.ErrFenced):
		d.opts.log.Warn("commit fenced: the split is no longer ours; its uncommitted tail replays under the new owner", "split", t.spec.ID)
		d.commitMu.Lock()
		d.retire(src, t, true)
		d.commitMu.Unlock()
		return nil
	case spate.IsRetryable(err):
		return d.deferCommit(t, &p, err)
	default:
		return fmt.Errorf("commit split %s: %w", t.spec.ID, err)
	}
}

// deferCommit keeps a commit that could not land for the split's next
// commit (p, when given, is the acknowledged progress: the resume cache).
func (d *CoordinationDriver[C]) deferCommit(t *tenancy, p *spate.SplitProgress, err error) error {
	// Not a warning per split and tick: with the store refusing writes
	// that was thousands of lines. The pipeline's controller retries the
	// deferred positions and warns, rate-limited, for all of them.
	d.opts.log.Debug("commit deferred; it rides the split's next commit", "split", t.spec.ID, "error", err)
	if p != nil {
		t.progress = p
	}
	d.commitMu.Lock()
	defer d.commitMu.Unlock()
	if d.collecting {
		d.deferred = append(d.deferred, t.partition)
		if d.deferredErr == nil {
			d.deferredErr = fmt.Errorf("commit split %s: %w", t.spec.ID, err)
		}
	}
	return nil
}

// TakeDeferred implements [commitDeferrer]: the partitions whose commit
// the last [CoordinationDriver.Commit] deferred, and the first such error.
func (d *CoordinationDriver[C]) TakeDeferred() ([]PartitionID, error) {
	out := slices.Clone(d.deferred)
	err := d.deferredErr
	d.deferred, d.deferredErr = d.deferred[:0], nil
	return out, err
}

// sweep commits terminal progress of live splits that completed without a
// new watermark (empty splits, tails acknowledged at the last commit).
func (d *CoordinationDriver[C]) sweep(src SplitSource) error {
	var firstErr error
	for _, t := range d.sortedHeld() {
		if t.state != tenancyLive || !t.opened || t.fenced || t.completed {
			continue
		}
		if t.unpublished != nil {
			if err := d.publish(t, t.unpublished); err != nil {
				firstErr = pickError(firstErr, err)
				continue
			}
		}
		if t.completing != nil {
			if err := d.finishCompletion(src, t); err != nil {
				firstErr = pickError(firstErr, err)
			}
			continue
		}
		if t.short > t.won && time.Since(t.shortAt) >= shortCommitRetry {
			// A commit the sink covered only in part: try the rest, or
			// again a later commit that carried more and failed (it may
			// have landed: a commit below it would move the watermark
			// back).
			sp, err := src.EncodeCommit(t.spec.ID, max(t.short, t.tried))
			if err == nil {
				err = d.commitTenancy(src, t, sp)
			}
			if err != nil {
				firstErr = pickError(firstErr, err)
				continue
			}
		}
		p, err := src.Sweep(t.spec.ID)
		if err != nil {
			firstErr = pickError(firstErr, err)
			continue
		}
		if p != nil && (p.Completed || p.Parked != (t.progress != nil && t.progress.Parked)) {
			if err := d.commitTenancy(src, t, *p); err != nil {
				firstErr = pickError(firstErr, err)
			}
		}
	}
	return firstErr
}

func (d *CoordinationDriver[C]) sortedHeld() []*tenancy {
	out := make([]*tenancy, 0, len(d.held))
	for _, t := range d.held {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *tenancy) int { return a.spec.ID.Compare(b.spec.ID) })
	return out
}

// Fail reports split as poison for this tenancy (an attempt is consumed)
// and revokes its lane. Failing a split not held is a no-op.
func (d *CoordinationDriver[C]) Fail(src SplitSource, split spate.SplitID, reason string) error {
	t := d.held[split]
	if t == nil {
		return nil
	}
	ctx, cancel := d.ctx()
	err := d.coord.Fail(ctx, split, reason)
	cancel()
	if err != nil && !errors.Is(err, spate.ErrFenced) {
		return err
	}
	d.retire(src, t, false)
	return nil
}

// Release hands back every held split (shutdown). Best effort.
//
// Held includes splits the coordinator gained that the coordination driver never
// polled: claims that landed just before the stop (a worker stopped
// while its first claims came in). The coordinator renews their leases
// until it closes, so a split left out here stays out of its peers'
// reach as long as the coordinator lives, not a lease's length.
func (d *CoordinationDriver[C]) Release(ctx context.Context, src SplitSource) error {
	ids := make([]spate.SplitID, 0, len(d.held))
	for id := range d.held {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, spate.SplitID.Compare)
	if d.stage != nil && src != nil {
		// A sink that rolls its output in parts may hold acknowledged
		// records no commit covers yet: a final commit covers them, so the
		// next owner does not read them again.
		for _, id := range ids {
			t := d.held[id]
			if t.state == tenancyRetired || !t.stageOpen || t.fenced || t.completed || t.acked <= t.won {
				continue
			}
			p, err := src.EncodeCommit(id, t.acked)
			if err != nil {
				continue
			}
			t.releasing = true
			if err := d.commitTenancy(src, t, p); err != nil {
				d.opts.log.Warn("final commit before the hand-back failed; the next owner reads the uncommitted tail again", "split", id, "error", err)
			}
		}
	}
	unpolled, _ := d.coord.Poll()
	for _, ev := range unpolled {
		if g, ok := ev.(spate.Gained); ok && d.held[g.Split.ID] == nil && !slices.Contains(ids, g.Split.ID) {
			ids = append(ids, g.Split.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.SortFunc(ids, spate.SplitID.Compare)
	return d.coord.Release(ctx, ids...)
}
