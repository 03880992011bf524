package spate

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Assignment publishing: the leader computes the assignment from its view
// (assignInput, then the pure assign.go) and writes the records that
// changed, pacing its computations and tracking the moves it published
// until they land and settle.

// publishState is the leader's assignment publishing: the pace of its
// computations, the write in flight, and the moves it published, until
// they land and settle.
type publishState struct {
	busy  bool          // an assignment write is in flight
	after time.Time     // no assignment computation before (publishPace)
	took  time.Duration // the last assignment computation's duration

	pinnedSince map[string]time.Time // moves in flight, since when
	landedAt    map[string]time.Time // moves that landed, when (settling)
	moving      map[string]bool      // moves in flight that left a live holder
	settledAt   time.Time            // when the next settling split may move again
	balanced    string               // members and budgets the improve pass last ran on (fleetSignature)
}

// settleEnded reports, once, that the settling pause set by the last
// publish is over at now: a settling split may move again.
func (p *publishState) settleEnded(now time.Time) bool {
	if p.settledAt.IsZero() || now.Before(p.settledAt) {
		return false
	}
	p.settledAt = time.Time{}
	return true
}

// leaderView is what the assignment input is built from.
type leaderView struct {
	now         time.Time
	pinnedSince map[string]time.Time // moves in flight, since when the leader has seen them
	pinFor      time.Duration        // how long a move may stay in flight pinned
	landedAt    map[string]time.Time // moves that landed, when the leader saw them land
	moving      map[string]bool      // moves between workers published and not yet seen landed
	settleFor   time.Duration        // how long a landed move's split is left where it is
	splits      map[string]*splitView
	presence    map[string]presenceEntry
	caps        map[string]int
	assigns     map[string]assignEntry
	departed    map[string]time.Time
	delay       time.Duration
	maxInFlight int
	seed        uint64
}

// assignInput is the pure input the leader feeds [computeAssignment]:
//
//   - members are the live instances, each with its advertised lane budget;
//   - the pool is every runnable, uncompleted split whose spec is known,
//     less the splits of departed instances still inside their
//     rebalance-delay window (held back so a bounced pod reclaims its own);
//   - a split's owner is its live lease holder, else its durable owner if
//     that one is live;
//   - a split whose last published destination (the live member whose
//     assignment record names it; the newer record if two do) is not its
//     owner is a move in flight: it is pinned to that destination until
//     the destination claims it, or until it has been in flight for pinFor
//     (a destination that never claims must not pin it for ever). While
//     anything is pinned, computeAssignment makes no improving move, so the fleet's
//     moves land before new ones are planned: a released split is never
//     sent elsewhere or back while its move is under way;
//   - a split whose move landed less than settleFor ago is settling: the
//     improve pass leaves it with its new owner, so loads that shift again
//     (splits completing in a job's endgame) do not send it straight back
//     to the worker that drained it.
//
// It also returns the moves in flight, pinned or with an expired pin (for
// trackPins).
func assignInput(v leaderView) (assignIn, map[string]bool) {
	reserved := map[string]bool{}
	if v.delay != NoRebalanceDelay && len(v.departed) > 0 {
		for id, s := range v.splits {
			if s.prog != nil {
				if _, gone := v.departed[s.prog.owner()]; gone {
					reserved[id] = true
				}
			}
		}
	}
	in := assignIn{Seed: v.seed}
	for _, inst := range slices.Sorted(maps.Keys(v.presence)) {
		budget := v.maxInFlight
		if c, ok := v.caps[inst]; ok && c > 0 {
			budget = c
		}
		in.Members = append(in.Members, assignMember{ID: inst, Budget: budget, Unproven: v.presence[inst].unproven})
	}
	// Records in revision order: if two live members' records name one
	// split (a publish whose write to the old assignee failed), the newer
	// record, the leader's latest word, decides — the same way every time.
	insts := slices.SortedFunc(maps.Keys(v.assigns), func(x, y string) int {
		return cmp.Compare(v.assigns[x].rev, v.assigns[y].rev)
	})
	named := map[string]string{}
	inFlight := map[string]bool{}
	for _, inst := range insts {
		if _, live := v.presence[inst]; live {
			for _, id := range v.assigns[inst].val.Splits {
				named[id] = inst
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(v.splits)) {
		s := v.splits[id]
		p := s.prog
		if p == nil || p.Status != statusRunnable || p.Completed || s.spec == nil || reserved[id] {
			continue
		}
		owner := p.owner()
		if s.lease != nil {
			owner = s.lease.Owner
		}
		if _, live := v.presence[owner]; !live {
			owner = ""
		}
		if p.Parked && owner != "" && s.lease != nil && s.lease.Owner == owner {
			// Held and parked: it stays where it is and takes no lane.
			if in.Parked == nil {
				in.Parked = map[string][]string{}
			}
			in.Parked[owner] = append(in.Parked[owner], id)
			continue
		}
		_, weight := s.own()
		split := assignSplit{ID: id, Weight: weight, Owner: owner}
		if dest := named[id]; dest != "" && dest != owner {
			inFlight[id] = true
			if since, ok := v.pinnedSince[id]; !ok || v.now.Sub(since) < v.pinFor {
				split.Owner, split.Pinned = dest, true
			}
		} else if owner != "" {
			at, ok := v.landedAt[id]
			// A move between workers that has landed (seen now, or before
			// and less than settleFor ago) settles.
			split.Settling = v.moving[id] || ok && v.now.Sub(at) < v.settleFor
		}
		in.Splits = append(in.Splits, split)
	}
	return in, inFlight
}

// withParked adds to result the splits each member holds parked: they
// stay with their holder beside what its budget was given.
func withParked(result map[string][]string, parked map[string][]string) map[string][]string {
	for inst, ids := range parked {
		result[inst] = append(result[inst], ids...)
		slices.Sort(result[inst])
	}
	return result
}

// assignWrite is one assignment record the leader writes or deletes.
type assignWrite struct {
	inst   string
	val    *assignmentVal // nil: delete
	rev    uint64         // expected revision (0: create)
	o      Outcome
	err    error
	moved  int
	delete bool
}

// publish computes the desired assignment and writes, beside the loop, the
// records that changed. It runs only when an input changed (the dirty
// flag), one publish at a time, and no sooner than publishPace times its
// last computation's duration after that computation began.
func (a *actor) publish(now time.Time) {
	if a.leader.pub.busy {
		return
	}
	a.dirty = false
	if a.planning.plan == nil || len(a.members.presence) == 0 {
		return
	}
	// Pace the next computation by this one's cost (see publishPace).
	started := time.Now()
	defer func() {
		a.leader.pub.took = time.Since(started)
		a.leader.pub.after = started.Add(publishPace * a.leader.pub.took)
	}()
	in, result := a.assign(now)
	a.leader.div.noteAssignment(in, result)
	moves := movesOf(in, result)
	gen := a.leader.term.generation
	records := leaderView{presence: a.members.presence, assigns: a.assigns.byInst, departed: a.members.departed}
	writes, moved := records.assignWrites(result, a.leader.div.asksFor(now), gen)
	if len(writes) == 0 {
		return
	}
	a.leader.pub.busy = true
	members := len(result)
	a.spawn(func(ctx context.Context) func() error {
		a.writeAssignments(ctx, writes)
		return func() error {
			a.leader.pub.busy = false
			a.publishDone(writes, moves, members, moved, gen)
			return nil
		}
	})
}

// assign computes the desired assignment from the view, tracks the moves
// in flight and the settling ones, and records whether the fleet is now
// balanced.
func (a *actor) assign(now time.Time) (assignIn, map[string][]string) {
	pub := &a.leader.pub
	in, inFlight := assignInput(leaderView{now: now, pinnedSince: pub.pinnedSince, pinFor: a.c.tm.pin,
		landedAt: pub.landedAt, moving: pub.moving, settleFor: a.c.tm.pin,
		splits: a.job.splits, presence: a.members.presence, caps: a.members.caps,
		assigns: a.assigns.byInst, departed: a.members.departed, delay: a.cfg.RebalanceDelay,
		maxInFlight: a.cfg.MaxInFlight, seed: a.fpHash})
	if next := trackPins(pub.pinnedSince, pub.landedAt, pub.moving, inFlight, now, a.c.tm.pin); !next.IsZero() {
		pub.settledAt = next // the improve pass may move it again then: publish anew
		a.wake.arm(next)
	}
	// Held splits move only when the fleet changed since the improve pass
	// last ran (a join, a departure, a member proven, a budget changed):
	// never to even out the weight left as splits complete.
	fleet := fleetSignature(in.Members)
	in.Steady = fleet == pub.balanced
	result := withParked(computeAssignment(in), in.Parked)
	// The fleet counts as balanced once the improve pass ran on it with
	// nothing held back: no move in flight (pinned) and none settling (a
	// settling split is not moved, so a newcomer could be left short of
	// its share until it settles; the publish due then must still balance).
	if !slices.ContainsFunc(in.Splits, func(s assignSplit) bool { return s.Pinned || s.Settling }) {
		pub.balanced = fleet
	}
	return in, result
}

// assignWrites lists the assignment records that publishing result at
// generation gen writes (those that differ from the view's) or deletes
// (those of instances neither present nor inside a delay window), and
// counts the splits result moves between instances.
func (v *leaderView) assignWrites(result map[string][]string, asks map[string][]divideAsk, gen uint64) (writes []*assignWrite, moved int) {
	// Previous assignee of each split, for the "moved" count: departed
	// instances' records first, then live members' override them.
	prev := map[string]string{}
	for _, live := range []bool{false, true} {
		for inst, e := range v.assigns {
			if _, present := v.presence[inst]; present == live {
				for _, id := range e.val.Splits {
					prev[id] = inst
				}
			}
		}
	}
	for _, inst := range slices.Sorted(maps.Keys(result)) {
		ids := result[inst]
		for _, id := range ids {
			if p, ok := prev[id]; ok && p != inst {
				moved++
			}
		}
		cached, ok := v.assigns[inst]
		if ok && cached.val.Generation == gen && slices.Equal(cached.val.Splits, ids) &&
			!slices.ContainsFunc(asks[inst], func(d divideAsk) bool { return !slices.Contains(cached.val.Divide, d) }) {
			continue // steady state writes nothing (an ask that expired is dropped at the next write)
		}
		w := &assignWrite{inst: inst, val: &assignmentVal{Schema: SchemaVersion, Generation: gen, Splits: ids, Divide: asks[inst]}}
		if ok {
			w.rev = cached.rev
		}
		writes = append(writes, w)
	}
	for _, inst := range slices.Sorted(maps.Keys(v.assigns)) {
		_, present := v.presence[inst]
		_, waiting := v.departed[inst]
		if !present && !waiting {
			writes = append(writes, &assignWrite{inst: inst, rev: v.assigns[inst].rev, delete: true})
		}
	}
	return writes, moved
}

// writeAssignments runs the writes beside the loop, publishConcurrency at
// a time, and leaves each one's outcome in it.
func (e *env) writeAssignments(ctx context.Context, writes []*assignWrite) {
	sem := make(chan struct{}, publishConcurrency)
	var wg sync.WaitGroup
	for _, w := range writes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			key := prefixAssign + w.inst
			switch {
			case w.delete:
				w.o, w.err = e.st.Delete(ctx, Durable, key, w.rev)
			case w.rev != 0:
				w.o, w.err = e.st.Update(ctx, Durable, key, encode(w.val), w.rev)
			default:
				w.o, w.err = e.st.Create(ctx, Durable, key, encode(w.val))
			}
		})
	}
	wg.Wait()
}

func (a *actor) publishDone(writes []*assignWrite, moves map[string]string, members, moved int, gen uint64) {
	changed := false
	for _, w := range writes {
		switch {
		case w.err != nil:
			a.log.Warn("assignment write failed; the next change or reconcile retries", "member", w.inst, "err", w.err)
		case w.delete:
			if w.o.Won {
				if e, ok := a.assigns.byInst[w.inst]; ok && e.rev == w.rev {
					delete(a.assigns.byInst, w.inst)
				}
				changed = true
			}
		case !w.o.Won:
			// The record moved (a deposed leader's late write) or exists
			// already: forget our cached copy only if it is the one the
			// write expected, and let the watch or the next reconcile
			// bring the record in before publishing again.
			if e, ok := a.assigns.byInst[w.inst]; ok && e.rev == w.rev {
				delete(a.assigns.byInst, w.inst)
			}
			a.failed(opKey{op: "publish"})
			a.dirty = true
		default:
			changed = true
			a.setAssign(w.inst, w.val, w.o.Revision)
			for _, id := range w.val.Splits {
				if moves[id] == w.inst {
					a.leader.pub.moving[id] = true // published: it settles once it lands
				}
			}
		}
	}
	if changed && moved > 0 {
		a.log.Info("assignment published", "members", members, "moved", moved, "generation", gen,
			"computed_in", a.leader.pub.took.Round(time.Microsecond))
	}
}

// trackPins remembers since when each move in flight has been seen, so
// that its pin can expire (an expired move stays recorded while it is
// still in flight, so it does not re-pin). A move between workers (in
// moving, see markMoves) that landed is remembered in
// landedAt for settleFor, and then forgotten; a first placement is not a
// move. It returns when the next landed move stops settling (zero if none
// is settling).
func trackPins(pinnedSince, landedAt map[string]time.Time, moving, inFlight map[string]bool, now time.Time, settleFor time.Duration) (next time.Time) {
	for id := range pinnedSince {
		if !inFlight[id] {
			delete(pinnedSince, id)
		}
	}
	for id := range moving {
		if !inFlight[id] {
			landedAt[id] = now // landed (or the split left the pool: forgotten after settleFor)
			delete(moving, id)
		}
	}
	for id := range inFlight {
		if _, ok := pinnedSince[id]; !ok {
			pinnedSince[id] = now
		}
	}
	for id, at := range landedAt {
		end := at.Add(settleFor)
		if !now.Before(end) {
			delete(landedAt, id)
			continue
		}
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	return next
}

// movesOf is the splits out sends away from a live holder, by
// destination: moves between workers, which settle once they land (a
// first placement, or a dead holder's split, is not a move).
// fleetSignature identifies the members and budgets an assignment was
// balanced for: ids, budgets and whether each is proven.
func fleetSignature(members []assignMember) string {
	var b strings.Builder
	for _, m := range members {
		fmt.Fprintf(&b, "%q/%d/%t;", m.ID, max(m.Budget, 1), m.Unproven)
	}
	return b.String()
}

func movesOf(in assignIn, out map[string][]string) map[string]string {
	owner := make(map[string]string, len(in.Splits))
	for _, s := range in.Splits {
		if s.Owner != "" && !s.Pinned {
			owner[s.ID] = s.Owner
		}
	}
	moves := map[string]string{}
	for m, ids := range out {
		for _, id := range ids {
			if o, ok := owner[id]; ok && o != m {
				moves[id] = m
			}
		}
	}
	return moves
}

// assignRecords is the assignment records as this worker last saw them,
// by instance: written only by their events (assignPut, assignDelete,
// assignSweep, assignAbsent) and by the outcome of the leader's own
// writes (publishDone).
type assignRecords struct {
	byInst map[string]assignEntry
}

type assignEntry struct {
	val *assignmentVal
	rev uint64
	at  uint64
}

// assignPut folds a put of an assignment record at rev. An unreadable
// record is ignored, never read as an empty one.
func (a *actor) assignPut(key string, value []byte, rev uint64) {
	inst := key[len(prefixAssign):]
	if e, ok := a.assigns.byInst[inst]; ok && rev <= e.rev {
		return
	}
	val, err := decodeAssignment(key, value)
	if err != nil {
		a.log.Warn("ignoring an unreadable assignment record (it is not read as an empty one)", "key", key, "err", err)
		return
	}
	a.setAssign(inst, val, rev)
}

func (a *actor) setAssign(inst string, val *assignmentVal, rev uint64) {
	if e, ok := a.assigns.byInst[inst]; ok && rev <= e.rev {
		return
	}
	a.assigns.byInst[inst] = assignEntry{val: val, rev: rev, at: a.job.clock}
	if inst == a.self {
		a.adoptAssignment(val, time.Now())
	}
}

// assignDelete folds a delete of inst's assignment record.
func (a *actor) assignDelete(inst string) {
	delete(a.assigns.byInst, inst)
	if inst == a.self {
		a.forgetAssignment()
	}
}

// assignSweep applies a listing of the whole durable keyspace that
// started at mark: a record seen before mark that the listing lacks is
// gone.
func (a *actor) assignSweep(listed map[string]bool, mark uint64) {
	for inst := range a.assigns.byInst {
		if !listed[prefixAssign+inst] && a.assignAbsent(inst, mark) && inst == a.self {
			a.forgetAssignment()
		}
	}
}

// assignAbsent applies the absence of inst's record from a complete read
// that started at mark, and reports whether the view held it from
// before.
func (a *actor) assignAbsent(inst string, mark uint64) bool {
	if e, ok := a.assigns.byInst[inst]; ok && e.at < mark {
		delete(a.assigns.byInst, inst)
		return true
	}
	return false
}

// forgetPeers forgets every record but self's: a scoped worker watches
// only its own.
func (r *assignRecords) forgetPeers(self string) {
	for inst := range r.byInst {
		if inst != self {
			delete(r.byInst, inst)
		}
	}
}

// forgetMoves forgets the moves in flight and settling: a scoped worker
// keeps no leader's bookkeeping.
func (p *publishState) forgetMoves() {
	clear(p.pinnedSince)
	clear(p.landedAt)
	clear(p.moving)
}
