package filesource

import (
	"encoding/json"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Runtime division (see the package documentation, "Division"): a
// running split gives up the unread remainder of its bytes to a child.

var (
	_ pipeline.SplitDivider     = (*Source)(nil)
	_ pipeline.DivisionProposer = (*Source)(nil)
	_ pipeline.FractionProposer = (*Source)(nil)
)

// MinDivideBytes is the least unread input a split divides: each half
// keeps at least [MinSplitBytes], the smallest split the planner makes.
const MinDivideBytes = 2 * MinSplitBytes

// DivisionPoint implements [pipeline.DivisionProposer]: the middle of
// what the lane has not read yet, if that is at least [MinDivideBytes].
// A followed file's split is never divided: its input grows.
func (s *Source) DivisionPoint(split spate.SplitID) (int64, bool) {
	return s.DivisionPointAt(split, 1, 2)
}

// DivisionPointAt implements [pipeline.FractionProposer]: num/den of the
// way through what the lane has not read yet, if the part given up and
// the part kept are each at least [MinSplitBytes] (at the middle: what is
// left is at least [MinDivideBytes]). A followed file's split is never
// divided.
func (s *Source) DivisionPointAt(split spate.SplitID, num, den int64) (int64, bool) {
	if num <= 0 || den <= num {
		return 0, false
	}
	st := s.state(split)
	if st == nil || st.lane == nil {
		return 0, false
	}
	l := st.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	end := l.end()
	left := end - l.pos
	if !l.divisible() || left < MinDivideBytes {
		return 0, false
	}
	at := l.pos + left/den*num + left%den*num/den
	if at-l.pos < MinSplitBytes || end-at < MinSplitBytes {
		return 0, false
	}
	return at, true
}

// TrySplit implements [pipeline.SplitDivider]: the lane stops before the
// first line that starts at or after position (or after what it has read,
// if it read past position), and gives up the rest of its bytes. The
// position is a byte offset, not a line start: as between two planned
// ranges, the lines that start before it are the primary's (its last one
// may end beyond it) and the residual skips to the first line start at or
// after it. The lane's lock serializes it with the lane's reads.
func (s *Source) TrySplit(split spate.SplitID, position int64) (spate.Division, bool) {
	st := s.state(split)
	if st == nil || st.lane == nil {
		return spate.Division{}, false // not open, or a followed file
	}
	l := st.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	end := l.end()
	pos := max(position, l.pos)
	if !l.divisible() || pos <= 0 || pos >= end {
		return spate.Division{}, false
	}
	prim, res, ok := cutDescriptor(l.files, l.origin, end, pos)
	if !ok {
		return spate.Division{}, false
	}
	pb, err1 := json.Marshal(prim)
	rb, err2 := json.Marshal(res)
	if err1 != nil || err2 != nil {
		return spate.Division{}, false
	}
	l.whole, l.dividing = l.limit, true
	l.limit = pos
	return spate.Division{Position: pos, Primary: pb, PrimaryWeight: uint64(pos),
		Residual: rb, ResidualWeight: uint64(end - pos)}, true
}

// SplitDone implements [pipeline.SplitDivider]: a kept division shortens
// the split for good; a refused one gives the lane its whole input back.
func (s *Source) SplitDone(split spate.SplitID, d spate.Division, kept bool) {
	st := s.state(split)
	if st == nil || st.lane == nil {
		return
	}
	l := st.lane
	l.mu.Lock()
	if !l.dividing {
		l.mu.Unlock()
		return
	}
	l.dividing = false
	if !kept {
		l.limit = l.whole
	}
	l.mu.Unlock()
	if kept {
		s.mu.Lock()
		st.total = d.Position
		s.mu.Unlock()
	}
}

// end is the split offset where the lane's input ends: its limit, or its
// members' total.
func (l *lane) end() int64 {
	if l.limit >= 0 {
		return l.limit
	}
	var n int64
	for _, f := range l.files {
		n += f.Size
	}
	return n - l.origin
}

// divisible reports whether the lane may be divided now: it is reading
// (not failed, stopped or at its end), not inside a range's first skip,
// and no division is in flight.
func (l *lane) divisible() bool {
	return !l.dividing && !l.skipping && !l.exhausted && !l.stopped && !l.failed && !l.noLine
}

// cutDescriptor divides the input of files from byte origin of the first
// (concatenated offsets) to split offset end at split offset pos: the
// primary keeps the members up to the one holding its last byte, the
// residual starts with the member holding pos. Both are range
// descriptors; their offsets are the members' concatenated ones.
func cutDescriptor(files []Member, origin, end, pos int64) (prim, res Descriptor, ok bool) {
	abs, absEnd := origin+pos, origin+end
	var base int64
	k, j, jBase := -1, -1, int64(0)
	for i, f := range files {
		if k < 0 && abs-1 < base+f.Size {
			k = i
		}
		if j < 0 && abs < base+f.Size {
			j, jBase = i, base
		}
		base += f.Size
	}
	if k < 0 || j < 0 || absEnd > base {
		return prim, res, false
	}
	prim = Descriptor{Version: RangeVersion, Files: files[:k+1], Range: &Range{Start: origin, End: abs}}
	res = Descriptor{Version: RangeVersion, Files: files[j:], Range: &Range{Start: abs - jBase, End: absEnd - jBase}}
	return prim, res, true
}
