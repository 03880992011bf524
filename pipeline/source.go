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
	// Stop reports a graceful stop in progress (see [StopSignal]).
	Stop *StopSignal
	// Metrics lets the source publish what only it can measure (lag).
	Metrics *SourceMetrics
	// Threads is the number of runner goroutines.
	Threads int
	// PerPartitionDetail mirrors [Config.PerPartitionDetail].
	PerPartitionDetail bool
}

// Source is the control plane of a pipeline's input. Only the controller
// goroutine calls these methods, one at a time, so an implementation needs
// no locking for its control plane (lanes run elsewhere).
//
// Error classes: a Fatal error (see [spate.IsFatal]; an unclassified error
// counts as Fatal) stops the pipeline; any other error is logged and
// tolerated. Embed [BaseSource] for the optional methods' defaults.
type Source interface {
	// Open is called once, before anything else.
	Open(ctx SourceCtx) error
	// PollEvents services control-plane work and returns one event, waiting
	// at most timeout. It must never block on data-plane progress that the
	// source gates itself.
	PollEvents(timeout time.Duration) (SourceEvent, error)
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
	// drain (not after a Drained exit, nor when Open failed). What the
	// source holds is handed back only at Close, after the final commit,
	// so that nothing read and written before the stop replays.
	StopReading() error
	// RenewHeld keeps whatever the source holds (leases) alive while the
	// controller waits on a revocation drain and cannot call PollEvents.
	RenewHeld()
}

// SourceCloser is implemented by sources with a close step after the final
// commit (a feed that hands back, a client to disconnect). Close must end
// by ctx's deadline; the runtime reserves [Config.CloseShare] of the drain
// deadline for it.
type SourceCloser interface {
	Close(ctx context.Context) error
}

// CommitDeferrer is implemented by sources whose Commit returns nil for a
// retryable failure and keeps the position for a later commit (a
// [CoordinatedSource]). Right after a Commit that returned nil the
// controller asks which partitions it deferred: their positions stay
// pending (retried at the next tick) and do not count as committed for
// [Config.MaxUncommittedBytes].
type CommitDeferrer interface {
	// TakeDeferred returns the partitions the last Commit deferred and the
	// first error that deferred one (nil, nil when it deferred none).
	TakeDeferred() ([]PartitionID, error)
}

// BaseSource supplies the optional methods of [Source] with neutral
// behaviour: no-op flush, pause, resume, hand-back and renewal; no reading
// on a stop.
type BaseSource struct{}

func (BaseSource) FlushCommits() error   { return nil }
func (BaseSource) Pause([]LaneID) error  { return nil }
func (BaseSource) Resume([]LaneID) error { return nil }
func (BaseSource) ReadingOnStop() bool   { return false }
func (BaseSource) StopReading() error    { return nil }
func (BaseSource) RenewHeld()            {}

// EventKind says what a [SourceEvent] is.
type EventKind uint8

const (
	// Idle: nothing happened within the timeout.
	Idle EventKind = iota
	// LanesAssigned is an eager, full replacement assignment that starts a
	// new assignment epoch covering exactly its lanes' partitions. Revoke
	// every lane before it. An empty assignment is legal: it is the ready
	// signal that marks the pipeline running.
	LanesAssigned
	// LanesAdded adds lanes to the current epoch; live lanes and their
	// in-flight acknowledgments are untouched. Lane ids must be new and
	// partitions never admitted before in this epoch.
	LanesAdded
	// LanesRevoked takes lanes away: the runtime stops and drains them,
	// waits on the barrier (one party per lane), commits and flushes
	// commits. Only then may the source finish the revocation.
	LanesRevoked
	// LanesRetired removes lanes whose work is delivered, acknowledged and
	// committed, with no barrier, flush or commit. Anything else must be
	// revoked.
	LanesRetired
	// CommitReady hints that the partitions' lanes reached end of input:
	// the runtime tightens the commit cadence for them. Latency only.
	CommitReady
	// Drained: the input is exhausted for good. The pipeline drains and
	// exits Completed only if everything was acknowledged and committed.
	// Report it only once no lane holds unemitted data; keep reporting it.
	Drained
)

func (k EventKind) String() string {
	switch k {
	case Idle:
		return "Idle"
	case LanesAssigned:
		return "LanesAssigned"
	case LanesAdded:
		return "LanesAdded"
	case LanesRevoked:
		return "LanesRevoked"
	case LanesRetired:
		return "LanesRetired"
	case CommitReady:
		return "CommitReady"
	case Drained:
		return "Drained"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// SourceEvent is what [Source.PollEvents] returns. Build it with the
// constructors; the zero value is Idle.
type SourceEvent struct {
	Kind       EventKind
	Lanes      []Lane        // LanesAssigned, LanesAdded
	LaneIDs    []LaneID      // LanesRevoked, LanesRetired
	Barrier    *drainBarrier // LanesRevoked
	Partitions []PartitionID // CommitReady
}

// idleEvent reports nothing new.
func idleEvent() SourceEvent { return SourceEvent{} }

// assignedEvent is a full replacement assignment (possibly empty).
func assignedEvent(lanes ...Lane) SourceEvent { return SourceEvent{Kind: LanesAssigned, Lanes: lanes} }

// addedEvent adds lanes to the current epoch.
func addedEvent(lanes ...Lane) SourceEvent { return SourceEvent{Kind: LanesAdded, Lanes: lanes} }

// revokedEvent revokes lanes with a fresh barrier of one party per lane,
// which it returns too so the source can wait on it itself.
func revokedEvent(lanes ...LaneID) (SourceEvent, *drainBarrier) {
	b := newDrainBarrier(len(lanes))
	return SourceEvent{Kind: LanesRevoked, LaneIDs: lanes, Barrier: b}, b
}

// retiredEvent removes finished, committed lanes.
func retiredEvent(lanes ...LaneID) SourceEvent {
	return SourceEvent{Kind: LanesRetired, LaneIDs: lanes}
}

// commitReadyEvent hints that partitions reached end of input.
func commitReadyEvent(partitions ...PartitionID) SourceEvent {
	return SourceEvent{Kind: CommitReady, Partitions: partitions}
}

// drainedEvent reports the input exhausted.
func drainedEvent() SourceEvent { return SourceEvent{Kind: Drained} }

// StopSignal lets a source see a graceful stop: Stopping reports true from
// the trigger until the controller's reading ends. The drain's commits, the
// final one included, run with the signal clear, so a source that behaves
// differently while stopping (declining new work) commits normally.
type StopSignal struct {
	flag   *atomic.Bool
	closed atomic.Bool
}

// Stopping reports a graceful stop whose reading is under way.
func (s *StopSignal) Stopping() bool {
	return s != nil && s.flag != nil && s.flag.Load() && !s.closed.Load()
}

func (s *StopSignal) close() { s.closed.Store(true) }
