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

// With the fleet unchanged (Steady), a split its live owner holds stays
// there however uneven the loads: the weight left is evened out with the
// splits nobody holds. The same input unsteady (the fleet just changed)
// does move held splits, so the case is one that would move.
func TestASteadyFleetMovesNoHeldSplit(t *testing.T) {
	in := assignIn{
		Members: []assignMember{{ID: "w0", Budget: 4}, {ID: "w1", Budget: 4}},
		Splits: []assignSplit{
			{ID: "a", Weight: 10, Owner: "w0"}, {ID: "b", Weight: 10, Owner: "w0"},
			{ID: "c", Weight: 10, Owner: "w0"}, {ID: "free", Weight: 1},
		},
	}
	moving := computeAssignment(in)
	require.NotEqual(t, []string{"a", "b", "c"}, moving["w0"], "unsteady, the improve pass evens the load")

	in.Steady = true
	steady := computeAssignment(in)
	require.Equal(t, []string{"a", "b", "c"}, steady["w0"])
	require.Equal(t, []string{"free"}, steady["w1"], "an unheld split goes to the lighter member")

	rapid.Check(t, func(t *rapid.T) {
		nm := rapid.IntRange(1, 5).Draw(t, "members")
		in := assignIn{Steady: true, Seed: rapid.Uint64().Draw(t, "seed")}
		room := map[string]int{}
		for i := range nm {
			id := fmt.Sprintf("w%d", i)
			b := rapid.IntRange(1, 6).Draw(t, "budget")
			in.Members = append(in.Members, assignMember{ID: id, Budget: b})
			room[id] = b
		}
		ns := rapid.IntRange(0, 30).Draw(t, "splits")
		for i := range ns {
			s := assignSplit{ID: fmt.Sprintf("s%02d", i), Weight: rapid.Uint64Range(0, 100).Draw(t, "w")}
			if o := fmt.Sprintf("w%d", rapid.IntRange(0, nm).Draw(t, "owner")); room[o] > 0 {
				s.Owner = o
				room[o]--
			}
			in.Splits = append(in.Splits, s)
		}
		out := computeAssignment(in)
		at := map[string]string{}
		for m, ids := range out {
			for _, id := range ids {
				at[id] = m
			}
		}
		for _, s := range in.Splits {
			if s.Owner != "" && at[s.ID] != s.Owner {
				t.Fatalf("held split %s moved from %s to %q in a steady fleet", s.ID, s.Owner, at[s.ID])
			}
		}
	})
}
