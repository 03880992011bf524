package spate

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// A join moves the newcomer's share and nothing more, in one publish:
// donors give only splits that leave them at or above the safe floor, so
// no gap opens that a second wave of moves would fill (before: 1.185× at
// 10k × 100 and 1.50× at 100k × 1000).
func TestJoinMovesOnlyTheNewcomersShare(t *testing.T) {
	for _, sz := range []struct{ splits, members int }{{10000, 100}, {100000, 10}, {100000, 1000}, {1000, 100}} {
		t.Run(fmt.Sprintf("%dx%d", sz.splits, sz.members), func(t *testing.T) {
			if testing.Short() && sz.splits > 10000 {
				t.Skip("large fleet")
			}
			in := settledBeforeJoin(benchInput(sz.splits, sz.members, true))
			moved, share := joinCost(in, computeAssignment(in))
			assert.LessOrEqual(t, moved, 1.1, "weight moved ÷ the newcomer's fair share")
			assert.GreaterOrEqual(t, share, 0.95, "the newcomer gets its share in one publish")
			assert.InDelta(t, share, moved, 1e-9, "every moved split went to the newcomer")
		})
	}
}

// maxQuietGap is exactly the largest gap moveLimit keeps a split of weight
// w from crossing.
func TestMaxQuietGap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.OneOf(rapid.Uint64Range(0, 1000), rapid.Uint64Range(1000, 1<<62), rapid.Uint64Range(math.MaxUint64/5*4, math.MaxUint64)).Draw(t, "w")
		g := maxQuietGap(w)
		if w > math.MaxUint64/5*4 {
			require.Equal(t, uint64(math.MaxUint64), g)
			return
		}
		require.Less(t, moveLimit(g), max(w, 1), "a split of weight %d moves across %d", w, g)
		require.GreaterOrEqual(t, moveLimit(g+1), max(w, 1), "%d is not the largest quiet gap for %d", g, w)
	})
}
