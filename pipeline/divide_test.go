package pipeline_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// divCoord is a fakeCoord with the Divider capability.
type divCoord struct {
	*fakeCoord
	divideErr error
	divides   []spate.Division
}

func (c *divCoord) Divide(_ context.Context, s spate.SplitID, _ spate.LeaseEpoch, d spate.Division) (spate.SplitID, error) {
	c.divides = append(c.divides, d)
	return spate.ChildSplitID(s, d.Position), c.divideErr
}

// divSplits is a fakeSplits whose splits can be divided: it gives up
// everything from the position asked for.
type divSplits struct {
	*fakeSplits
	read  int64 // the lane's read position
	tried []int64
	done  []bool
}

func (s *divSplits) TrySplit(_ spate.SplitID, pos int64) (spate.Division, bool) {
	pos = max(pos, s.read)
	s.tried = append(s.tried, pos)
	return spate.Division{Position: pos, Primary: []byte("primary"), Residual: []byte("residual")}, true
}

func (s *divSplits) SplitDone(_ spate.SplitID, _ spate.Division, kept bool) {
	s.done = append(s.done, kept)
}

func newDivFixture(t *testing.T) (*pipeline.CoordinationDriver[*divCoord], *divCoord, *divSplits) {
	coord := &divCoord{fakeCoord: newFakeCoord()}
	src := &divSplits{fakeSplits: newFakeSplits()}
	d := pipeline.NewCoordinationDriver(coord)
	d.Open(pipeline.SourceCtx{Issuer: pipeline.NewCheckpointer(nil).Issuer()})
	_, err := d.Start(nil)
	require.NoError(t, err)
	coord.push(gained("a", 1))
	ev, err := d.PollEvents(src, 0)
	require.NoError(t, err)
	require.Equal(t, pipeline.LanesAdded, ev.Kind)
	return d, coord, src
}

// A durable division keeps the primary; the source is told so, and the
// division reached the coordinator at (or beyond) the position asked for.
func TestDriverDivideKeepsThePrimary(t *testing.T) {
	d, coord, src := newDivFixture(t)
	src.read = 7
	child, divided, err := d.Divide(src, sid("a"), 3)
	require.NoError(t, err)
	require.True(t, divided)
	require.Equal(t, spate.ChildSplitID(sid("a"), 7), child, "divided beyond what the lane read")
	require.Equal(t, []bool{true}, src.done)
	require.Len(t, coord.divides, 1)
	require.Equal(t, int64(7), coord.divides[0].Position)
}

// A refused division wrote nothing: the source reads its whole split
// again and the tenancy goes on.
func TestDriverDivideRefusedReadsOnWhole(t *testing.T) {
	d, coord, src := newDivFixture(t)
	coord.divideErr = spate.Retryablef("below the watermark: %w", spate.ErrDivisionRefused)
	_, divided, err := d.Divide(src, sid("a"), 3)
	require.NoError(t, err)
	require.False(t, divided)
	require.Equal(t, []bool{false}, src.done, "the source must take its whole split back")
	pa := findPartition(t, d, "a")
	require.NoError(t, d.Commit(src, []pipeline.Watermark{{Partition: pa, Offset: 4}}))
	require.Len(t, coord.commits["a"], 1, "the tenancy goes on")
}

// A division whose outcome is unknown ends the tenancy: the lane reads no
// further, is revoked, commits nothing more, and the split is handed back.
func TestDriverDivideInDoubtEndsTheTenancy(t *testing.T) {
	d, coord, src := newDivFixture(t)
	pa := findPartition(t, d, "a")
	coord.divideErr = spate.Retryablef("the store did not answer")
	_, divided, err := d.Divide(src, sid("a"), 3)
	require.Error(t, err)
	require.False(t, divided)
	require.Equal(t, []bool{true}, src.done, "the lane must not read past the position")
	ev, err := d.PollEvents(src, 0)
	require.NoError(t, err)
	require.Equal(t, pipeline.LanesRevoked, ev.Kind)
	require.NoError(t, d.Commit(src, []pipeline.Watermark{{Partition: pa, Offset: 4}}))
	require.Empty(t, coord.commits["a"], "a tenancy in doubt commits nothing more")
	require.Equal(t, [][]spate.SplitID{{sid("a")}}, coord.releases, "the split is handed back")
}

// Without the capability on both sides nothing is divided.
func TestDriverDivideNeedsBothCapabilities(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	_, divided, err := f.d.Divide(&divSplits{fakeSplits: f.src}, sid("a"), 3)
	require.NoError(t, err)
	require.False(t, divided, "a coordinator without Divide divides nothing")
	d, _, _ := newDivFixture(t)
	_, divided, err = d.Divide(newFakeSplits(), sid("a"), 3)
	require.NoError(t, err)
	require.False(t, divided, "a source without TrySplit divides nothing")
}

func findPartition(t *testing.T, d *pipeline.CoordinationDriver[*divCoord], split string) pipeline.PartitionID {
	for _, a := range d.Assignments() {
		if a.Split.String() == split {
			return a.Partition
		}
	}
	require.FailNow(t, "split not held", "split %s", split)
	return 0
}

// fracSplits is a divSplits that proposes divisions at a fraction of
// what is unread, its split being [read, end) with end moved back by each
// division it gave.
type fracSplits struct {
	*divSplits
	end int64
}

func (s *fracSplits) DivisionPoint(id spate.SplitID) (int64, bool) {
	return s.DivisionPointAt(id, 1, 2)
}

func (s *fracSplits) DivisionPointAt(_ spate.SplitID, num, den int64) (int64, bool) {
	left := s.end - s.read
	if left < den {
		return 0, false
	}
	return s.read + left*num/den, true
}

func (s *fracSplits) TrySplit(id spate.SplitID, pos int64) (spate.Division, bool) {
	d, ok := s.divSplits.TrySplit(id, pos)
	if ok {
		s.end = d.Position
	}
	return d, ok
}

// An ask for k pieces feeds k idle workers in one round: the coordination driver cuts
// what is unread into k+1 equal parts from the end, with k ordinary
// divisions (each one fenced write, each below the last one's position),
// and the split keeps the first part. Before, an ask made one child, in
// the middle, whatever the number of idle workers.
func TestDriverDividesIntoAsManyPiecesAsAsked(t *testing.T) {
	d, coord, div := newDivFixture(t)
	div.read = 100
	src := &fracSplits{divSplits: div, end: 500}
	coord.push(spate.DivideRequested{Split: sid("a"), Pieces: 3})
	_, err := d.PollEvents(src, 0)
	require.NoError(t, err)
	var positions []int64
	for _, dv := range coord.divides {
		positions = append(positions, dv.Position)
	}
	require.Equal(t, []int64{400, 300, 200}, positions, "three children of 100 each; the split keeps [100, 200)")
	require.Equal(t, []bool{true, true, true}, div.done)

	// A source that proposes no fraction divides once, in the middle.
	d2, coord2, div2 := newDivFixture(t)
	div2.read = 100
	coord2.push(spate.DivideRequested{Split: sid("a"), Pieces: 3})
	_, err = d2.PollEvents(&midSplits{div2}, 0)
	require.NoError(t, err)
	require.Len(t, coord2.divides, 1)
	require.Equal(t, int64(300), coord2.divides[0].Position)
}

// midSplits proposes only the middle of [read, 500).
type midSplits struct{ *divSplits }

func (s *midSplits) DivisionPoint(spate.SplitID) (int64, bool) { return s.read + (500-s.read)/2, true }
