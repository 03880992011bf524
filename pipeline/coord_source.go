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
	BaseSource
	Driver  *CoordinationDriver[C]
	Splits  SplitSource
	Planner spate.SplitPlanner
	started bool
}

// NewCoordinatedSource assembles a coordinated source.
func NewCoordinatedSource[C spate.SplitCoordinator](coord C, splits SplitSource, planner spate.SplitPlanner, opts ...DriverOption) *CoordinatedSource[C] {
	return &CoordinatedSource[C]{Driver: NewCoordinationDriver(coord, opts...), Splits: splits, Planner: planner}
}

// Open implements [Source].
func (s *CoordinatedSource[C]) Open(ctx SourceCtx) error {
	s.Driver.Open(ctx)
	return nil
}

// PollEvents implements [Source]: the first call starts the coordinator and
// returns the empty ready assignment.
func (s *CoordinatedSource[C]) PollEvents(timeout time.Duration) (SourceEvent, error) {
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

// StopReading implements [Source]: it hands back the splits whose reading
// is unfinished; finished ones stay to commit their completion.
func (s *CoordinatedSource[C]) StopReading() error {
	r, _ := s.Splits.(StopReader)
	ctx, cancel := s.Driver.ctx()
	defer cancel()
	// Leave the fleet first, so the partial hand-back below is not read as
	// an ordinary release that this worker then claims straight back.
	if err := spate.Depart(ctx, s.Driver.Coordinator()); err != nil {
		return err
	}
	return s.Driver.ReleaseWhere(ctx, s.Splits, func(id spate.SplitID) bool {
		return r != nil && !r.Unfinished(id)
	})
}

// Close implements [SourceCloser]: whatever is still held is handed back.
func (s *CoordinatedSource[C]) Close(ctx context.Context) error {
	return s.Driver.Release(ctx)
}
