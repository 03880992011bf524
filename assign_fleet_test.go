package spate

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// simFleet simulates the leader's publish loop over a fleet, one step at a
// time: the leader publishes (assignInput, then computeAssignment, then the changed
// records), a holder releases a split it is no longer assigned, a
// destination claims a split assigned to it. It checks the assignment
// reaches a fixed point: destinations never change while moves land.
type simFleet struct {
	budgets   map[string]int
	weights   map[string]uint64
	holder    map[string]string // split -> current holder, "" none
	dest      map[string]string // split -> last published destination
	rev       uint64
	records   map[string]assignEntry
	pinned    map[string]time.Time
	landed    map[string]time.Time
	moving    map[string]bool
	settleFor time.Duration // how long a landed move settles (0: not at all)
	now       time.Time
	changes   int                 // destinations changed by a publish after the first
	revoked   map[string]int      // split -> times released by a holder
	released  map[string][]string // split -> members that released it
	returned  int                 // claims by a member that had released the split
}

func newSimFleet(budgets map[string]int, weights map[string]uint64, holder map[string]string) *simFleet {
	return &simFleet{budgets: budgets, weights: weights, holder: holder, dest: map[string]string{},
		records: map[string]assignEntry{}, pinned: map[string]time.Time{}, landed: map[string]time.Time{}, moving: map[string]bool{}, now: time.Unix(1000, 0),
		revoked: map[string]int{}, released: map[string][]string{}}
}

func (f *simFleet) publish(first bool) {
	splits := map[string]*splitView{}
	for id, w := range f.weights {
		h := f.holder[id]
		splits[id] = lv(statusRunnable, h, w, h)
	}
	presence := map[string]presenceEntry{}
	for m := range f.budgets {
		presence[m] = presenceEntry{rev: 1}
	}
	in, inFlight := assignInput(leaderView{now: f.now, pinnedSince: f.pinned, pinFor: time.Hour, landedAt: f.landed, moving: f.moving, settleFor: f.settleFor,
		splits: splits, presence: presence, caps: f.budgets, assigns: f.records, maxInFlight: 1, seed: 7,
		delay: NoRebalanceDelay, departed: map[string]time.Time{}})
	trackPins(f.pinned, f.landed, f.moving, inFlight, f.now, f.settleFor)
	out := computeAssignment(in)
	for id := range movesOf(in, out) {
		f.moving[id] = true // every write of the simulation lands
	}
	for _, m := range slices.Sorted(maps.Keys(out)) {
		if e, ok := f.records[m]; ok && slices.Equal(e.val.Splits, out[m]) {
			continue
		}
		f.rev++
		f.records[m] = assignEntry{val: &assignmentVal{Schema: SchemaVersion, Splits: out[m]}, rev: f.rev}
	}
	for m := range f.records {
		if _, ok := f.budgets[m]; !ok {
			delete(f.records, m)
		}
	}
	next := map[string]string{}
	for m, ids := range out {
		for _, id := range ids {
			next[id] = m
		}
	}
	if !first {
		for id := range f.weights {
			if next[id] != f.dest[id] {
				f.changes++
			}
		}
	}
	f.dest = next
}

// pending lists the steps the fleet can take: releases by holders no longer
// assigned a split, claims by destinations of unheld splits.
func (f *simFleet) pending() []string {
	var steps []string
	for _, id := range slices.Sorted(maps.Keys(f.weights)) {
		h, d := f.holder[id], f.dest[id]
		switch {
		case h != "" && h != d:
			steps = append(steps, "release "+id)
		case h == "" && d != "":
			steps = append(steps, "claim "+id)
		}
	}
	return steps
}

func (f *simFleet) apply(step string) {
	var verb, id string
	fmt.Sscan(step, &verb, &id)
	if verb == "release" {
		f.revoked[id]++
		f.released[id] = append(f.released[id], f.holder[id])
		f.holder[id] = ""
	} else {
		f.holder[id] = f.dest[id]
		if slices.Contains(f.released[id], f.holder[id]) {
			f.returned++
		}
	}
	f.now = f.now.Add(time.Second)
}

// settle takes steps (chosen by pick) and publishes after each, until no
// step is left.
func (f *simFleet) settle(t require.TestingT, pick func(n int) int) {
	for range 10_000 {
		steps := f.pending()
		if len(steps) == 0 {
			return
		}
		f.apply(steps[pick(len(steps))])
		f.publish(false)
	}
	require.Fail(t, "the fleet never settled")
}

// The case the liveness issue measured on the exported function: with the
// intermediate "released, not yet claimed" state fed back, s1 went back to
// w2 and the split changed hands for ever. In-flight moves are pinned now:
// the destinations never change while the moves land, and once landed the
// next publish moves nothing.
func TestAssignSettlesOnTheMeasuredPingPongCase(t *testing.T) {
	budgets := map[string]int{"w0": 3, "w1": 2, "w2": 4, "w3": 2}
	weights := map[string]uint64{"s0": 9, "s1": 1, "s2": 5, "s3": 6, "s4": 8, "s5": 2, "s6": 4}
	holder := map[string]string{"s0": "w3", "s1": "w2", "s2": "w2", "s3": "w1", "s4": "w3", "s5": "w1", "s6": "w0"}
	for first := range 3 { // which pending step runs first
		f := newSimFleet(budgets, weights, maps.Clone(holder))
		f.publish(true)
		require.NotEmpty(t, f.pending(), "the case starts with moves to make")
		f.settle(t, func(n int) int { return first % n })
		require.Zero(t, f.changes, "destinations changed while moves were landing")
		f.publish(false)
		require.Zero(t, f.changes, "a settled fleet's publish moved something")
		for id, by := range f.released {
			require.LessOrEqual(t, f.revoked[id], 1, "split %s revoked %d times", id, f.revoked[id])
			require.NotEqual(t, by[0], f.holder[id], "split %s went back to its releaser", id)
		}
	}
}

// Random fleets: a fixed fleet stops moving after its first placement; one
// membership change (a join or a departure) then revokes each split at most
// once and never sends one back to the member that released it.
func TestAssignReachesAFixedPoint(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nm := rapid.IntRange(1, 5).Draw(t, "members")
		budgets := map[string]int{}
		for i := range nm {
			budgets[fmt.Sprintf("w%d", i)] = rapid.IntRange(1, 6).Draw(t, "budget")
		}
		ns := rapid.IntRange(0, 24).Draw(t, "splits")
		weights := map[string]uint64{}
		for i := range ns {
			weights[fmt.Sprintf("s%02d", i)] = uint64(rapid.IntRange(1, 20).Draw(t, "weight"))
		}
		pick := func(n int) int { return rapid.IntRange(0, n-1).Draw(t, "step") }
		f := newSimFleet(budgets, weights, map[string]string{})
		f.publish(true)
		f.settle(t, pick)
		require.Zero(t, f.changes, "a fixed fleet changed destinations after its first placement")
		f.publish(false)
		require.Zero(t, f.changes, "a settled fixed fleet's publish moved something")

		// One membership change.
		if rapid.Bool().Draw(t, "join") || nm == 1 {
			budgets[fmt.Sprintf("w%d", nm)] = rapid.IntRange(1, 6).Draw(t, "newBudget")
		} else {
			gone := fmt.Sprintf("w%d", rapid.IntRange(0, nm-1).Draw(t, "leaver"))
			delete(budgets, gone)
			for id, h := range f.holder {
				if h == gone {
					f.holder[id] = "" // its leases expire
				}
			}
		}
		f.revoked, f.released = map[string]int{}, map[string][]string{}
		f.publish(true)
		f.changes = 0
		f.settle(t, pick)
		require.Zero(t, f.changes, "destinations changed while the membership change's moves landed")
		f.publish(false)
		require.Zero(t, f.changes, "the fleet kept moving after the membership change settled")
		for id, n := range f.revoked {
			require.LessOrEqual(t, n, 1, "split %s revoked %d times after one membership change", id, n)
			require.NotEqual(t, f.released[id][0], f.holder[id], "split %s went back to its releaser", id)
		}
	})
}

// A fixed fleet of 5 members and 200 weighted splits, placed from nothing
// and settled one step at a time in several orders: no split changes
// destination after the first placement, and no split is handed off.
func TestAssignFixedFleetOf5x200HandsNothingOff(t *testing.T) {
	budgets := map[string]int{}
	for i := range 5 {
		budgets[fmt.Sprintf("w%d", i)] = 64
	}
	weights := map[string]uint64{}
	for i := range 200 {
		weights[fmt.Sprintf("s%03d", i)] = uint64(1 + (i*7919)%97)
	}
	for order := range 4 {
		f := newSimFleet(budgets, weights, map[string]string{})
		f.publish(true)
		f.settle(t, func(n int) int { return (order * 31) % n })
		f.publish(false)
		require.Zero(t, f.changes, "order %d: destinations changed after the first placement", order)
		require.Empty(t, f.revoked, "order %d: splits were handed off in a fixed fleet", order)
	}
}

// A job's endgame: splits complete one by one on a settled fleet, and
// every completion shifts the loads. With no settling, a split just moved
// to a member could be moved straight back to the member that drained it
// (measured in the demo: 3 splits regained by their releaser and 2 revoked
// twice in 10 runs). A landed move settles for a while: no split goes back
// to a member that released it.
func TestEndgameNeverSendsASplitBackToItsReleaser(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nm := rapid.IntRange(2, 5).Draw(t, "members")
		budgets := map[string]int{}
		for i := range nm {
			budgets[fmt.Sprintf("w%d", i)] = rapid.IntRange(1, 6).Draw(t, "budget")
		}
		ns := rapid.IntRange(2, 24).Draw(t, "splits")
		weights := map[string]uint64{}
		for i := range ns {
			weights[fmt.Sprintf("s%02d", i)] = uint64(rapid.IntRange(1, 20).Draw(t, "weight"))
		}
		pick := func(n int) int { return rapid.IntRange(0, n-1).Draw(t, "step") }
		f := newSimFleet(budgets, weights, map[string]string{})
		f.settleFor = time.Hour // the endgame below takes less
		f.publish(true)
		f.settle(t, pick)
		for len(f.weights) > 0 {
			// A held split completes: it leaves the pool.
			var held []string
			for _, id := range slices.Sorted(maps.Keys(f.weights)) {
				if f.holder[id] != "" {
					held = append(held, id)
				}
			}
			if len(held) == 0 {
				break
			}
			done := held[rapid.IntRange(0, len(held)-1).Draw(t, "completes")]
			delete(f.weights, done)
			delete(f.holder, done)
			f.publish(false)
			f.settle(t, pick)
		}
		require.Zero(t, f.returned, "a split went back to a member that had released it (released %v)", f.released)
	})
}
