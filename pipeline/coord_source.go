package pipeline

import (
	"context"
	"time"

	"github.com/spate-go/spate"
)

// StopReader is implemented by split sources whose lanes can read on
// through a graceful stop.
type StopReader interface {
	// Unfinished reports whether the split's lane still has input to read.
	Unfinished(split spate.SplitID) bool
}

// CoordinatedSource is a [Source] over a [SplitSource] and a
// [CoordinationDriver]: it starts the coordinator on the first poll,
// forwards events and commits, fails poisoned splits, and on a graceful
// stop reads on while a held split is unfinished, then hands the
// unfinished ones back.
type CoordinatedSource[C spate.SplitCoordinator] struct {
	baseSource
	Driver  *CoordinationDriver[C]
	Splits  SplitSource
	Planner spate.SplitPlanner
	started bool
}

// NewCoordinatedSource assembles a coordinated source.
func NewCoordinatedSource[C spate.SplitCoordinator](coord C, splits SplitSource, planner spate.SplitPlanner, opts ...DriverOption) *CoordinatedSource[C] {
	return &CoordinatedSource[C]{Driver: NewCoordinationDriver(coord, opts...), Splits: splits, Planner: planner}
}

// StageOutput makes the source's commits carry sink's committable and
// publish it once they win: exactly-once output. [Build] calls it for a
// staging sink; call it before Run when assembling the runtime by hand.
func (s *CoordinatedSource[C]) StageOutput(sink StagingSink) error {
	return s.Driver.StageOutput(sink)
}

// Open implements [Source].
func (s *CoordinatedSource[C]) Open(ctx SourceCtx) error {
	s.Driver.Open(ctx)
	return nil
}

// PollEvents implements [Source]: the first call starts the coordinator and
// returns the empty ready assignment.
func (s *CoordinatedSource[C]) PollEvents(timeout time.Duration) (sourceEvent, error) {
	if !s.started {
		s.started = true
		return s.Driver.Start(s.Planner)
	}
	return s.Driver.PollEvents(s.Splits, timeout)
}

// Commit implements [Source].
func (s *CoordinatedSource[C]) Commit(positions []Watermark) error {
	return s.Driver.Commit(s.Splits, positions)
}

// TakeDeferred implements [commitDeferrer].
func (s *CoordinatedSource[C]) TakeDeferred() ([]PartitionID, error) {
	return s.Driver.TakeDeferred()
}

// ReadingOnStop implements [Source]: true while a held split is unfinished
// (only for split sources implementing [StopReader]).
func (s *CoordinatedSource[C]) ReadingOnStop() bool {
	r, ok := s.Splits.(StopReader)
	if !ok {
		return false
	}
	for _, a := range s.Driver.Assignments() {
		if !a.Draining && r.Unfinished(a.Split) {
			return true
		}
	}
	return false
}

// StopReading implements [Source]: the worker leaves the fleet (no new
// claims; its presence and any leadership go, so peers plan without it),
// and keeps what it holds until [CoordinatedSource.Close]. The runners
// then drain, the sinks flush and the final commit lands before Close
// hands the splits back, so a resume after a graceful stop replays
// nothing. (Handing the unfinished splits back here, before the drain,
// let a peer start sooner but lost the final commit of everything this
// worker had read and was still writing: a SIGTERM mid-run replayed
// thousands of lines.)
func (s *CoordinatedSource[C]) StopReading() error {
	ctx, cancel := s.Driver.ctx()
	defer cancel()
	return s.Driver.Coordinator().Depart(ctx)
}

// Close implements [sourceCloser]: whatever is still held is handed back.
func (s *CoordinatedSource[C]) Close(ctx context.Context) error {
	return s.Driver.Release(ctx, s.Splits)
}
