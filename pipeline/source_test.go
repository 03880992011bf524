package pipeline_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

// Each constructor builds the event its kind names; the zero event is
// Idle; a revocation carries a fresh barrier of one party per lane, the
// same one it returns.
func TestSourceEventConstructors(t *testing.T) {
	assert.Equal(t, pipeline.SourceEvent{}, pipeline.IdleEvent())
	assert.Equal(t, pipeline.Idle, pipeline.SourceEvent{}.Kind)

	ev := pipeline.AssignedEvent()
	assert.Equal(t, pipeline.LanesAssigned, ev.Kind)
	assert.Empty(t, ev.Lanes, "an empty assignment is legal: the ready signal")
	assert.Equal(t, pipeline.LanesAdded, pipeline.AddedEvent().Kind)

	ev, b := pipeline.RevokedEvent(3, 4)
	assert.Equal(t, pipeline.LanesRevoked, ev.Kind)
	assert.Equal(t, []pipeline.LaneID{3, 4}, ev.LaneIDs)
	require.NotNil(t, b)
	assert.Same(t, b, ev.Barrier, "the source waits on the barrier the runtime arrives at")
	assert.Equal(t, 2, b.Remaining(), "one party per revoked lane")
	_, again := pipeline.RevokedEvent(3, 4)
	assert.NotSame(t, b, again, "every revocation has a barrier of its own")

	ev = pipeline.RetiredEvent(5)
	assert.Equal(t, pipeline.LanesRetired, ev.Kind)
	assert.Equal(t, []pipeline.LaneID{5}, ev.LaneIDs)
	assert.Nil(t, ev.Barrier, "a retirement waits on nothing")

	ev = pipeline.CommitReadyEvent(1, 2)
	assert.Equal(t, pipeline.CommitReady, ev.Kind)
	assert.Equal(t, []pipeline.PartitionID{1, 2}, ev.Partitions)
	assert.Equal(t, pipeline.Drained, pipeline.DrainedEvent().Kind)
}

func TestEventKindNames(t *testing.T) {
	names := map[pipeline.EventKind]string{
		pipeline.Idle:          "Idle",
		pipeline.LanesAssigned: "LanesAssigned",
		pipeline.LanesAdded:    "LanesAdded",
		pipeline.LanesRevoked:  "LanesRevoked",
		pipeline.LanesRetired:  "LanesRetired",
		pipeline.CommitReady:   "CommitReady",
		pipeline.Drained:       "Drained",
	}
	for k, want := range names {
		assert.Equal(t, want, k.String())
	}
	assert.Equal(t, "EventKind(99)", pipeline.EventKind(99).String())
}

// BaseSource's optional methods do nothing and fail nothing, and it never
// reads on after a stop.
func TestBaseSourceIsNeutral(t *testing.T) {
	var s pipeline.BaseSource
	assert.NoError(t, s.FlushCommits())
	assert.NoError(t, s.Pause([]pipeline.LaneID{1}))
	assert.NoError(t, s.Resume([]pipeline.LaneID{1}))
	assert.NoError(t, s.StopReading())
	assert.False(t, s.ReadingOnStop())
	s.RenewHeld()
}

// A source that was given no stop signal (a nil one, or one the runtime
// did not wire) never sees a stop.
func TestStopSignalUnwiredIsNeverStopping(t *testing.T) {
	var none *pipeline.StopSignal
	assert.False(t, none.Stopping())
	assert.False(t, (&pipeline.StopSignal{}).Stopping())
}
