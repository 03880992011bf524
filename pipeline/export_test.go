package pipeline

import "context"

// The engine's names, unexported in the package, under their old names
// for the tests of package pipeline_test.
type AckSet = ackSet
type SinkHooks = sinkHooks

const PushBlocked = pushBlocked
const PushDone = pushDone
const PushFatal = pushFatal

type PushOutcome = pushOutcome

const BlockCapacity = blockCapacity

var AddedEvent = addedEvent
var AssignedEvent = assignedEvent
var CommitReadyEvent = commitReadyEvent
var DrainedEvent = drainedEvent
var IdleEvent = idleEvent
var RetiredEvent = retiredEvent
var RevokedEvent = revokedEvent

// The low-level source contract, sealed in the package (only
// CoordinatedSource implements it), under its old names for the tests
// that drive the runtime with fake sources.
type BaseSource = baseSource
type SourceEvent = sourceEvent
type EventKind = eventKind
type StopSignal = stopSignal
type CommitDeferrer = commitDeferrer

const (
	Idle          = evIdle
	LanesAssigned = evLanesAssigned
	LanesAdded    = evLanesAdded
	LanesRevoked  = evLanesRevoked
	LanesRetired  = evLanesRetired
	CommitReady   = evCommitReady
	Drained       = evDrained
)

// The runtime's assembly from parts, and the runner's chain.
var New = newRuntime

type Chain = runnerChain

// NopSink accepts every write and keeps nothing (benchmarks).
type NopSink struct{}

// Write implements [Sink].
func (NopSink) Write(context.Context, int, []Record) error { return nil }

// WriteChunks implements [ChunkedSink].
func (NopSink) WriteChunks(context.Context, int, [][]Record) error { return nil }
