package pipeline

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
