package main

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// The scan source divides a running split the way Beam checks trySplit:
// read to every position r, divide at every position p. It refuses when
// nothing is left to give; otherwise the division is at max(p, r), the
// primary and the residual together are the original range without
// overlap, and the lane reads no id of the residual. A refused division
// (SplitDone false) gives the lane its whole range back.
func TestScanSourceDividesAtEveryPosition(t *testing.T) {
	const lo, n = 100, 6
	id := spate.MustSplitID("ids")
	rng := func(d []byte) [2]int64 {
		return [2]int64{int64(binary.BigEndian.Uint64(d)), int64(binary.BigEndian.Uint64(d[8:]))}
	}
	for r := int64(0); r <= n; r++ {
		for p := int64(0); p <= n; p++ {
			for _, kept := range []bool{true, false} {
				s := &scanSource{lanes: map[spate.SplitID]*scanLane{}}
				desc := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, lo), lo+n)
				lane, err := s.OpenSplit(pipeline.SplitOpening{Spec: spate.NewSplitSpec(id, desc), Issuer: pipeline.NewCheckpointer(nil).Issuer()})
				require.NoError(t, err)
				var read []int64
				poll := func(max int) {
					b, err := lane.Poll(max, 0)
					require.NoError(t, err)
					if b != nil {
						for _, pl := range b.Payloads {
							read = append(read, lo+pl.Offset)
						}
					}
				}
				if r > 0 {
					poll(int(r))
				}
				d, ok := s.TrySplit(id, p)
				if r == n || p >= n {
					require.False(t, ok, "read %d, at %d: nothing to give", r, p)
					continue
				}
				require.True(t, ok, "read %d, at %d", r, p)
				at := max(p, r)
				require.Equal(t, at, d.Position)
				require.Equal(t, [2]int64{lo, lo + at}, rng(d.Primary), "read %d, at %d: the primary", r, p)
				require.Equal(t, [2]int64{lo + at, lo + n}, rng(d.Residual), "read %d, at %d: the residual", r, p)
				s.SplitDone(id, d, kept)
				poll(100)
				poll(100)
				want := at
				if !kept {
					want = n
				}
				require.Len(t, read, int(want), "read %d, at %d, kept %t: the lane reads to its end", r, p, kept)
				for i, v := range read {
					require.Equal(t, lo+int64(i), v)
				}
				c, err := s.EncodeCommit(id, want)
				require.NoError(t, err)
				require.True(t, c.Completed, "the primary completes at the division")
			}
		}
	}
}
