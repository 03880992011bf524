package pipeline

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// RawPayload is one record as a lane polled it.
type RawPayload struct {
	// Value is the record body.
	Value []byte
	// Key is the record key, nil when absent.
	Key []byte
	// Partition is the record's checkpoint partition.
	Partition PartitionID
	// Offset is the record's position in its partition. The batch's last
	// record's offset plus one is the watermark its acknowledgment commits.
	Offset int64
	// TimestampMs is the record's time in Unix milliseconds (0 if unknown).
	TimestampMs int64
}

// Batch is the result of one lane poll: payloads and exactly one
// acknowledgment handle, issued by the lane through its [AckIssuer] with
// the offset of the batch's last record. The runtime owns the handle's
// reference from the moment Poll returns.
//
// The runtime finishes with Payloads before the lane's next Poll, so a lane
// may reuse the slices' memory then.
type Batch struct {
	Payloads []RawPayload
	Ack      *AckRef
}

// Lane is one pollable data-plane object, owned by one runner goroutine.
type Lane interface {
	ID() LaneID
	Partition() PartitionID
	// Poll returns a batch, or (nil, nil) when nothing is ready. When idle
	// it blocks up to timeout and never spins; timeout may be zero. An error
	// whose class is Fatal (see [spate.IsFatal]) stops the pipeline; any
	// other error is logged and the lane is polled again later.
	Poll(maxRecords int, timeout time.Duration) (*Batch, error)
}

// SourceCtx is what the runtime hands a source when it opens it.
type SourceCtx struct {
	// Issuer is the acknowledgment issuer. Clone it per producer context;
	// all batches of one partition in one epoch must come from one issuer.
	Issuer *AckIssuer
	// Stop reports a graceful stop in progress.
	Stop *stopSignal
	// Metrics lets the source publish what only it can measure (lag).
	Metrics *sourceMetrics
	// Threads is the number of runner goroutines.
	Threads int
	// PerPartitionDetail mirrors [Config.PerPartitionDetail].
	PerPartitionDetail bool
}

// Source is the control plane of a pipeline's input as the runtime drives
// it, and what [Build] takes. [CoordinatedSource] is its implementation:
// the events it returns are the package's own, so the contract is sealed
// in the package, and a source author writes a [SplitSource] (and its
// [Lane]) instead. Only the controller goroutine calls these methods, one
// at a time, so an implementation needs no locking for its control plane
// (lanes run elsewhere).
//
// Error classes: a Fatal error (see [spate.IsFatal]; an unclassified error
// counts as Fatal) stops the pipeline; any other error is logged and
// tolerated.
type Source interface {
	// Open is called once, before anything else.
	Open(ctx SourceCtx) error
	// PollEvents services control-plane work and returns one event, waiting
	// at most timeout. It must never block on data-plane progress that the
	// source gates itself.
	PollEvents(timeout time.Duration) (sourceEvent, error)
	// Commit stores committable positions: per partition, one past the last
	// acknowledged record.
	Commit(positions []Watermark) error
	// FlushCommits makes stored positions durable. It is called after every
	// revocation drain and once at shutdown.
	FlushCommits() error
	// Pause asks the source to stop fetching for lanes (backpressure).
	Pause(lanes []LaneID) error
	// Resume restarts fetching.
	Resume(lanes []LaneID) error
	// ReadingOnStop reports whether the source still reads what it holds
	// during a graceful stop. While true the controller keeps running
	// (polling, committing) until the stop's reserve; false ends the stop's
	// reading at once.
	ReadingOnStop() bool
	// StopReading ends the stop's reading: the source takes on no new work.
	// It is called once when the controller loop ends, before the runners
	// drain (not after a drained exit, nor when Open failed). What the
	// source holds is handed back only at Close, after the final commit,
	// so that nothing read and written before the stop replays.
	StopReading() error
	// RenewHeld keeps whatever the source holds (leases) alive while the
	// controller waits on a revocation drain and cannot call PollEvents.
	RenewHeld()
}

// sourceCloser is implemented by sources with a close step after the final
// commit (a feed that hands back, a client to disconnect). Close must end
// by ctx's deadline; the runtime reserves [Config.CloseShare] of the drain
// deadline for it.
type sourceCloser interface {
	Close(ctx context.Context) error
}

// commitDeferrer is implemented by sources whose Commit returns nil for a
// retryable failure and keeps the position for a later commit (a
// [CoordinatedSource]). Right after a Commit that returned nil the
// controller asks which partitions it deferred: their positions stay
// pending (retried at the next tick) and do not count as committed for
// [Config.MaxUncommittedBytes].
type commitDeferrer interface {
	// TakeDeferred returns the partitions the last Commit deferred and the
	// first error that deferred one (nil, nil when it deferred none).
	TakeDeferred() ([]PartitionID, error)
}

// baseSource supplies the optional methods of [Source] with neutral
// behaviour: no-op flush, pause, resume, hand-back and renewal; no reading
// on a stop.
type baseSource struct{}

func (baseSource) FlushCommits() error   { return nil }
func (baseSource) Pause([]LaneID) error  { return nil }
func (baseSource) Resume([]LaneID) error { return nil }
func (baseSource) ReadingOnStop() bool   { return false }
func (baseSource) StopReading() error    { return nil }
func (baseSource) RenewHeld()            {}

// eventKind says what a [sourceEvent] is.
type eventKind uint8

const (
	// evIdle: nothing happened within the timeout.
	evIdle eventKind = iota
	// evLanesAssigned is an eager, full replacement assignment that starts a
	// new assignment epoch covering exactly its lanes' partitions. Revoke
	// every lane before it. An empty assignment is legal: it is the ready
	// signal that marks the pipeline running.
	evLanesAssigned
	// evLanesAdded adds lanes to the current epoch; live lanes and their
	// in-flight acknowledgments are untouched. Lane ids must be new and
	// partitions never admitted before in this epoch.
	evLanesAdded
	// evLanesRevoked takes lanes away: the runtime stops and drains them,
	// waits on the barrier (one party per lane), commits and flushes
	// commits. Only then may the source finish the revocation.
	evLanesRevoked
	// evLanesRetired removes lanes whose work is delivered, acknowledged and
	// committed, with no barrier, flush or commit. Anything else must be
	// revoked.
	evLanesRetired
	// evCommitReady hints that the partitions' lanes reached end of input:
	// the runtime tightens the commit cadence for them. Latency only.
	evCommitReady
	// evDrained: the input is exhausted for good. The pipeline drains and
	// exits Completed only if everything was acknowledged and committed.
	// Report it only once no lane holds unemitted data; keep reporting it.
	evDrained
)

func (k eventKind) String() string {
	switch k {
	case evIdle:
		return "Idle"
	case evLanesAssigned:
		return "LanesAssigned"
	case evLanesAdded:
		return "LanesAdded"
	case evLanesRevoked:
		return "LanesRevoked"
	case evLanesRetired:
		return "LanesRetired"
	case evCommitReady:
		return "CommitReady"
	case evDrained:
		return "Drained"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// sourceEvent is what [Source.PollEvents] returns. Build it with the
// constructors; the zero value is evIdle.
type sourceEvent struct {
	Kind       eventKind
	Lanes      []Lane        // evLanesAssigned, evLanesAdded
	LaneIDs    []LaneID      // evLanesRevoked, evLanesRetired
	Barrier    *drainBarrier // evLanesRevoked
	Partitions []PartitionID // evCommitReady
}

// idleEvent reports nothing new.
func idleEvent() sourceEvent { return sourceEvent{} }

// assignedEvent is a full replacement assignment (possibly empty).
func assignedEvent(lanes ...Lane) sourceEvent {
	return sourceEvent{Kind: evLanesAssigned, Lanes: lanes}
}

// addedEvent adds lanes to the current epoch.
func addedEvent(lanes ...Lane) sourceEvent { return sourceEvent{Kind: evLanesAdded, Lanes: lanes} }

// revokedEvent revokes lanes with a fresh barrier of one party per lane,
// which it returns too so the source can wait on it itself.
func revokedEvent(lanes ...LaneID) (sourceEvent, *drainBarrier) {
	b := newDrainBarrier(len(lanes))
	return sourceEvent{Kind: evLanesRevoked, LaneIDs: lanes, Barrier: b}, b
}

// retiredEvent removes finished, committed lanes.
func retiredEvent(lanes ...LaneID) sourceEvent {
	return sourceEvent{Kind: evLanesRetired, LaneIDs: lanes}
}

// commitReadyEvent hints that partitions reached end of input.
func commitReadyEvent(partitions ...PartitionID) sourceEvent {
	return sourceEvent{Kind: evCommitReady, Partitions: partitions}
}

// drainedEvent reports the input exhausted.
func drainedEvent() sourceEvent { return sourceEvent{Kind: evDrained} }

// stopSignal lets a source see a graceful stop: Stopping reports true from
// the trigger until the controller's reading ends. The drain's commits, the
// final one included, run with the signal clear, so a source that behaves
// differently while stopping (declining new work) commits normally.
type stopSignal struct {
	flag   *atomic.Bool
	closed atomic.Bool
}

// Stopping reports a graceful stop whose reading is under way.
func (s *stopSignal) Stopping() bool {
	return s != nil && s.flag != nil && s.flag.Load() && !s.closed.Load()
}

func (s *stopSignal) close() { s.closed.Store(true) }
