package spate

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/bits"
	"slices"
	"sort"
)

// assignMember is one live member as the assignment sees it.
type assignMember struct {
	ID string
	// Budget is the member's lane budget: the most splits it may be given.
	// Values below 1 count as 1.
	Budget int
	// Unproven: the leader has not yet seen this member renew its presence
	// (it may be the record of a process that died, kept alive until its
	// TTL runs out). It is given unplaced splits, but the improve pass
	// takes no split from another member to give it: a held split revoked
	// toward a dead member would wait a lease for nothing.
	Unproven bool
}

// assignSplit is one claimable split as the assignment sees it.
type assignSplit struct {
	ID     string
	Weight uint64 // 0 counts as 1
	// Owner is the split's current owner (the live lease's owner, else the
	// durable record's), "" if none. An owner that is not a member is dead.
	Owner string
	// Pinned marks a move in flight: Owner is the member the split was last
	// assigned to, which has not claimed it yet (the previous holder may
	// still be draining it). A pinned split stays with its Owner while the
	// Owner has budget, and while any split is pinned no improving move is
	// made: the assignment holds still until its moves have landed, so an
	// intermediate state (a split released, not yet claimed) can never be
	// read as a reason to send it elsewhere, or back.
	Pinned bool
	// Settling marks a split whose last move landed recently: the improve
	// pass leaves it with its owner, so a move is not undone (the split
	// sent back to the worker that just drained it) when the loads shift
	// again, as they do in a job's endgame, before the move has paid off.
	// It is placed like any other split when its owner is gone or full.
	Settling bool
}

// assignIn is everything the desired assignment depends on.
type assignIn struct {
	Members []assignMember
	// Splits is the claimable pool: runnable, not completed, spec known, not
	// withheld by a rebalance delay.
	Splits []assignSplit
	// Seed keys the tie-break hashes. It must be the job's (the fingerprint
	// hash), never the leader's, so that a failover does not re-break ties
	// and churn the fleet.
	Seed uint64
	// Steady: membership and lane budgets are those of the last balanced
	// assignment. A split then stays with its live owner whatever the
	// loads: moving a split under way to even out the weight left as other
	// splits complete costs a drain for little. Only splits nobody holds
	// yet (the fill pass's) may move. A join, a departure or a changed
	// budget clears it, and the improve pass may move any split again.
	Steady bool
	// Parked are the splits each live member holds parked (their input is
	// idle): they stay with their holder, outside the pool and its budget,
	// so they take no lane a waiting split could have.
	Parked map[string][]string
}

// maxImprovingMoves bounds the improve pass as a termination backstop.
const maxImprovingMoves = 4096

// computeAssignment computes the desired assignment: a weight-balanced, sticky map
// from member id to its sorted split ids. It is a pure function and
// guarantees:
//
//  1. determinism in its input;
//  2. no split is assigned to two members;
//  3. fixpoint: feeding the output back as ownership reproduces it, so a
//     settled fleet publishes and drains nothing;
//  4. local optimality: no single split can move to a member with spare
//     budget and lower the sum of squared loads by a move the hysteresis
//     allows (see moveLimit), unless a split is pinned: moves in flight
//     hold the improve pass back; settling splits are not moved, and when
//     Steady, neither is any split its live owner keeps;
//  5. totality: a split is left out only when every lane is full.
//
// It runs three passes: sticky (a live owner with budget keeps its split,
// heaviest first), fill (longest-processing-time greedy onto the least
// loaded member with budget) and improve (repeatedly the single best move,
// largest reduction of the sum of squared loads first). Unlike a scan of
// every member pair per move, the improve pass finds each move in
// O(members × log splits): for a source member the best target is always
// the least-loaded member with budget, and the best split is the one whose
// weight is closest to half the load gap.
//
// Members with an empty list are present in the result.
func computeAssignment(in assignIn) map[string][]string {
	out := make(map[string][]string, len(in.Members))
	if len(in.Members) == 0 {
		return out
	}
	members := slices.Clone(in.Members)
	slices.SortFunc(members, func(a, b assignMember) int { return cmp.Compare(a.ID, b.ID) })
	members = slices.CompactFunc(members, func(a, b assignMember) bool { return a.ID == b.ID })
	m := len(members)
	idx := make(map[string]int, m)
	st := &assignState{
		load:     make([]uint64, m),
		count:    make([]int, m),
		budget:   make([]int, m),
		nameHash: make([]uint64, m),
		unproven: make([]bool, m),
		held:     make([][]heldSplit, m),
		fixed:    make([][]int, m),
	}
	for i, mb := range members {
		idx[mb.ID] = i
		st.budget[i] = max(mb.Budget, 1)
		st.nameHash[i] = keyedHash(in.Seed, mb.ID)
		st.unproven[i] = mb.Unproven
	}

	// Pool order: heaviest first, then id.
	pool := make([]poolSplit, 0, len(in.Splits))
	for _, s := range in.Splits {
		pool = append(pool, poolSplit{assignSplit: s, w: max(s.Weight, 1), hash: keyedHash(in.Seed, s.ID)})
	}
	slices.SortFunc(pool, func(a, b poolSplit) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	pool = slices.CompactFunc(pool, func(a, b poolSplit) bool { return a.ID == b.ID })

	// 1. Sticky.
	unplaced := make([]int, 0, len(pool))
	for i := range pool {
		if o, ok := idx[pool[i].Owner]; ok && st.count[o] < st.budget[o] {
			if in.Steady && !pool[i].Pinned {
				st.fix(o, i, &pool[i])
			} else {
				st.place(o, i, &pool[i])
			}
			continue
		}
		unplaced = append(unplaced, i)
	}

	// 2. Fill: least loaded member with budget; ties to the smallest keyed
	// name hash, so a fleet of empty members does not pile onto whichever
	// name sorts first.
	fh := &fillHeap{st: st}
	for i := range m {
		if st.count[i] < st.budget[i] {
			fh.items = append(fh.items, i)
		}
	}
	sort.Sort(fh)
	for _, i := range unplaced {
		if len(fh.items) == 0 {
			break // every lane is full: the rest queue
		}
		o := fh.items[0]
		st.place(o, i, &pool[i])
		if st.count[o] >= st.budget[o] {
			fh.popFront()
		} else {
			fh.fixFront()
		}
	}

	// 3. Improve, unless moves are in flight. The cap is a termination
	// backstop only: it is never below the pool's size, so a newcomer gets
	// its whole share in one publish.
	pinned := slices.ContainsFunc(pool, func(p poolSplit) bool { return p.Pinned })
	for range max(maxImprovingMoves, len(pool)) {
		if pinned || !st.improve(pool) {
			break
		}
	}

	for i, mb := range members {
		ids := make([]string, 0, len(st.held[i])+len(st.fixed[i]))
		for _, h := range st.held[i] {
			ids = append(ids, pool[h.pool].ID)
		}
		for _, k := range st.fixed[i] {
			ids = append(ids, pool[k].ID)
		}
		slices.Sort(ids)
		out[mb.ID] = ids
	}
	return out
}

type poolSplit struct {
	assignSplit
	w    uint64
	hash uint64
}

// heldSplit is one split on a member, kept sorted by (weight, hash).
type heldSplit struct {
	w, hash uint64
	pool    int
}

func heldLess(a, b heldSplit) int {
	if c := cmp.Compare(a.w, b.w); c != 0 {
		return c
	}
	return cmp.Compare(a.hash, b.hash)
}

type assignState struct {
	load     []uint64
	count    []int
	budget   []int
	nameHash []uint64
	unproven []bool
	held     [][]heldSplit // the splits the improve pass may move
	fixed    [][]int       // settling or steady splits: placed, never moved (pool indexes)
}

func satAdd(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return math.MaxUint64
	}
	return s
}

func (st *assignState) place(o, i int, p *poolSplit) {
	if p.Settling {
		st.fix(o, i, p)
		return
	}
	h := heldSplit{w: p.w, hash: p.hash, pool: i}
	at, _ := slices.BinarySearchFunc(st.held[o], h, heldLess)
	st.held[o] = slices.Insert(st.held[o], at, h)
	st.load[o] = satAdd(st.load[o], p.w)
	st.count[o]++
}

// fix places a split the improve pass must not move.
func (st *assignState) fix(o, i int, p *poolSplit) {
	st.fixed[o] = append(st.fixed[o], i)
	st.load[o] = satAdd(st.load[o], p.w)
	st.count[o]++
}

func (st *assignState) remove(o int, h heldSplit) {
	at, found := slices.BinarySearchFunc(st.held[o], h, heldLess)
	if !found {
		panic("spate: assignment bookkeeping lost a split")
	}
	st.held[o] = slices.Delete(st.held[o], at, at+1)
	st.load[o] -= min(h.w, st.load[o]) // saturated loads stay non-negative
	st.count[o]--
}

// gain is w × (gap − w) as a 128-bit value (hi, lo): the reduction of the
// sum of squared loads, halved. It is only meaningful when gap > w.
func gain(w, gap uint64) (uint64, uint64) { return bits.Mul64(w, gap-w) }

func gainLess(ah, al, bh, bl uint64) bool { return ah < bh || ah == bh && al < bl }

// improve applies the single best improving move, if any.
func (st *assignState) improve(pool []poolSplit) bool {
	// The two least-loaded members with budget, (load, name hash) order.
	t1, t2 := -1, -1
	better := func(a, b int) bool {
		return st.load[a] < st.load[b] || st.load[a] == st.load[b] && st.nameHash[a] < st.nameHash[b]
	}
	for i := range st.load {
		if st.count[i] >= st.budget[i] || i < len(st.unproven) && st.unproven[i] {
			continue
		}
		switch {
		case t1 < 0 || better(i, t1):
			t1, t2 = i, t1
		case t2 < 0 || better(i, t2):
			t2 = i
		}
	}
	if t1 < 0 {
		return false
	}
	// A move into t1 that leaves its donor at or above the floor (the
	// next-least-loaded member's load) is preferred: a donor that sinks
	// below everyone else opens a gap that the next moves would fill from
	// a third member, and so on — a cascade that, after a join, moved up
	// to 1.5× the newcomer's share. Only when no such move exists is the
	// best move taken anyway, so the result is still locally optimal.
	floor := uint64(0)
	if t2 >= 0 {
		floor = min(st.load[t2], st.safeFloor(t1))
	}
	bestFrom, bestTo, best, found := st.bestMove(t1, t2, floor, true)
	if !found {
		bestFrom, bestTo, best, found = st.bestMove(t1, t2, 0, false)
	}
	if !found {
		return false
	}
	st.remove(bestFrom, best)
	st.place(bestTo, best.pool, &pool[best.pool])
	return true
}

// safeFloor is the lowest load a member other than t1 may be left at
// without opening a move into it: every member f's lightest split is
// heavier than moveLimit(load[f] − floor).
func (st *assignState) safeFloor(t1 int) uint64 {
	var floor uint64
	for f, h := range st.held {
		if f == t1 || len(h) == 0 {
			continue
		}
		g := maxQuietGap(h[0].w)
		if st.load[f] > g {
			floor = max(floor, st.load[f]-g)
		}
	}
	return floor
}

// maxQuietGap is the largest load gap across which no split of weight w
// (or heavier) may move: the largest g with moveLimit(g) < w.
func maxQuietGap(w uint64) uint64 {
	if w <= 1 {
		return 1 // moveLimit(1) = 0 < 1; moveLimit(2) = 1
	}
	if w > math.MaxUint64/5*4 {
		return math.MaxUint64 // no load gap can move so heavy a split
	}
	g := w + w/4 // about 1.25 w, where moveLimit(g) ≈ w; the loops below step a few times
	for g > 0 && moveLimit(g) >= w {
		g--
	}
	for moveLimit(g+1) < w {
		g++
	}
	return g
}

// bestMove finds the best single move into the least-loaded member t1
// (t2 when the source is t1 itself), largest gain first. With keepFloor,
// only moves that leave the donor's load at or above floor count.
func (st *assignState) bestMove(t1, t2 int, floor uint64, keepFloor bool) (from, to int, best heldSplit, found bool) {
	from, to = -1, -1
	var bh, bl uint64
	for f := range st.load {
		t := t1
		if f == t1 {
			t = t2
		}
		if t < 0 || st.load[f] <= st.load[t] {
			continue
		}
		gap := st.load[f] - st.load[t]
		limit := moveLimit(gap)
		if keepFloor {
			if t != t1 || st.load[f] < floor {
				continue
			}
			limit = min(limit, st.load[f]-floor)
		}
		cand, ok := bestSplitFor(st.held[f], gap, limit)
		if !ok {
			continue
		}
		h, l := gain(cand.w, gap)
		if from < 0 || gainLess(bh, bl, h, l) || h == bh && l == bl && cand.hash > best.hash {
			from, to, best, bh, bl = f, t, cand, h, l
		}
	}
	return from, to, best, from >= 0
}

// moveLimit is the hysteresis of the improve pass: a split of weight w
// moves across a load gap only if w <= gap - gap/5 (rounded so that the
// move still strictly improves). A move that barely improves balance
// (w close to the gap) costs a drain and replays its uncommitted tail for
// almost nothing, and as splits complete in a job's endgame such marginal
// imbalances appear again and again: moves must gain enough to pay for a
// drain.
func moveLimit(gap uint64) uint64 {
	if gap == 0 {
		return 0
	}
	return min(gap-gap/5, gap-1)
}

// bestSplitFor picks, among splits with weight <= limit (at most
// moveLimit(gap)), the one maximising w × (gap − w) — the weight closest
// to gap/2 — breaking equal gains by the larger keyed id hash. held is
// sorted by (weight, hash).
func bestSplitFor(held []heldSplit, gap, limit uint64) (heldSplit, bool) {
	if len(held) == 0 || held[0].w > limit {
		return heldSplit{}, false
	}
	// Candidates: the heaviest weight <= min(gap/2, limit) and the
	// lightest weight above it if still within limit; within one weight
	// the largest hash wins, which is the last of its group.
	cut := min(gap/2, limit)
	var cands []heldSplit
	lo := sort.Search(len(held), func(i int) bool { return held[i].w > cut })
	if lo > 0 {
		cands = append(cands, held[lo-1])
	}
	if lo < len(held) && held[lo].w <= limit {
		w := held[lo].w
		end := sort.Search(len(held), func(i int) bool { return held[i].w > w })
		cands = append(cands, held[end-1])
	}
	var best heldSplit
	var bh, bl uint64
	for k, c := range cands {
		h, l := gain(c.w, gap)
		if k == 0 || gainLess(bh, bl, h, l) || h == bh && l == bl && c.hash > best.hash {
			best, bh, bl = c, h, l
		}
	}
	return best, len(cands) > 0
}

// fillHeap orders members with budget by (load, name hash); the fill pass
// only ever raises the front's load, so a sift-down keeps it ordered.
type fillHeap struct {
	st    *assignState
	items []int
}

func (f *fillHeap) Len() int { return len(f.items) }
func (f *fillHeap) Less(i, j int) bool {
	a, b := f.items[i], f.items[j]
	la, lb := f.st.load[a], f.st.load[b]
	return la < lb || la == lb && f.st.nameHash[a] < f.st.nameHash[b]
}
func (f *fillHeap) Swap(i, j int) { f.items[i], f.items[j] = f.items[j], f.items[i] }

// fixFront restores order after the front's load grew: it is a sorted
// slice, so move the front right until it is in place (binary search).
func (f *fillHeap) fixFront() {
	x := f.items[0]
	rest := f.items[1:]
	at := sort.Search(len(rest), func(i int) bool {
		y := rest[i]
		lx, ly := f.st.load[x], f.st.load[y]
		return lx < ly || lx == ly && f.st.nameHash[x] < f.st.nameHash[y]
	})
	copy(f.items[0:at], rest[:at])
	f.items[at] = x
}

func (f *fillHeap) popFront() { f.items = f.items[1:] }

// keyedHash is a stable 64-bit hash of s keyed by seed (FNV-1a over the
// seed and the string, then a splitmix64 finaliser).
func keyedHash(seed uint64, s string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(s))
	return mix64(h.Sum64())
}

func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}
