package spate

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// The division trigger (docs/decisions/043): while a member of the fleet
// holds nothing and no split waits for one, the leader asks the owners of
// the running splits with the longest expected remaining time to divide
// them, one piece for each such member.
//
// The leader is where the decision is made because it alone sees both
// halves of it: the assignment (which members hold nothing, and whether
// any split is left unplaced) and every split's progress record. A
// commit's record carries the owner's estimate of the input it has left
// (SplitProgress.Remaining, in the split's weight units; before its first
// commit, all its weight); the leader measures each running split's rate
// from two of its records (the drop in Remaining over the owner's own
// WrittenAtMs clock, so no clocks are compared), and the expected
// remaining time is what is left ÷ that rate. It measures while every
// split is placed, busy fleet or not, so that a member that runs out of
// work is fed on the next scan. A split with no rate yet (just claimed) is
// timed at the median of the measured ones, or, when none is measured
// (a job's start), ranked by what it has left: an idle member is fed at
// once, not two commit intervals later. A split whose measured time is
// not more than divideWorth of its commit intervals is not asked for.
// The idle members' pieces go one at a time to the split that would still
// take longest (a split given k pieces expects 1/(k+1) of its time), and
// each ask names its pieces: the ask travels in the owner's assignment
// record (assignmentVal.Divide), the owner's coordinator emits
// [DivideRequested], and the owner's source divides it with decision
// 036's fenced writes, one per piece. The leader never writes a split's
// record: only the owner knows where it has read.
//
// Only members that hold nothing count, not free lanes: the lanes of a
// paced worker (backfill's --rate) share its one pace, so a child given to
// a member that reads already gained nothing and was moved again.
//
// Bounded: at most as many pieces outstanding as members holding
// nothing; an ask stands for divideCooldown commit intervals of its split
// (askStands before one is measured) and the split is not asked again
// meanwhile; a split is asked at most once in one state (one tenancy, one
// count of children; an ask made before its first commit, when its
// owner's lane may not read yet, once more after it), so a source that
// declines (a file being followed, a remainder below the source's
// minimum) costs one assignment write, not a stream of them; and no ask
// is made while a child is not created yet, or a split with no owner was
// not seen by the last assignment (it will take a member counted idle).
// A child the assignment placed does not hold the next ask back until its
// claim: its member no longer counts as idle.
//
// A division does not restart the measurement. Its owner's pace is what it
// was: the divided split keeps its measured rate and commit interval, and
// each child starts with them (its parent's pace, the best estimate until
// two of its own records measure it). The division's record says what
// the primary has left (divide.go, dividedRecord), so the residual is not
// measured as read.

const (
	// divideWorth is how many of its commit intervals a split's expected
	// remaining time must exceed before it is worth dividing: a division
	// costs a few store writes and a claim. One: the fleet's last worker
	// then finishes within about a commit interval of the others (the
	// issue's goal); with two, a remainder of 1-2 intervals stayed on one
	// worker while the rest idled (a finish spread of up to 1.5 s at a
	// 1 s commit interval, scripts/fleet-bench.sh with --min-splits 1).
	divideWorth = 1
	// divideCooldown is how many of the split's commit intervals an ask
	// stands (the owner acts on it at once; this covers its round trip
	// and the division's write) before the leader may ask again.
	divideCooldown = 3
	// maxAsksPerState bounds the asks for one split in one state (its
	// tenancy's epoch and its number of children): a source that declines
	// would decline again.
	maxAsksPerState = 1
	// divideScanPace spaces the leader's scans of the running splits.
	divideScanPace = 200 * time.Millisecond
	// askStands is how long an ask stands when its split's commit
	// interval is not measured yet (asked before its second commit).
	askStands = 3 * time.Second
)

// divideAsk is the leader's ask that the member holding Split divide it,
// as its assignment record carries it. Epoch and Children are the
// tenancy and the number of children the split's record named when the
// leader asked: an ask the owner has answered (the record names more), or
// one made of an earlier tenancy, is not acted on again.
//
// Pieces is how many children the owner should make in this one round:
// the members that hold nothing when the leader asked (one child each),
// at least 1. Omitted when 1, so that a one-piece ask reads as before.
type divideAsk struct {
	Split    string `json:"split"`
	Epoch    uint64 `json:"epoch"`
	Children int    `json:"children"`
	Pieces   int    `json:"pieces,omitempty"`
}

// rateSample is the leader's measurement of one running split: its
// record when first seen in the current state, and the last change.
type rateSample struct {
	epoch    uint64
	children int
	firstRem uint64
	firstAt  int64 // the owner's WrittenAtMs
	lastRem  uint64
	lastAt   int64
	interval int64 // ms between the last two records seen (0: one seen)
	// pace is the rate and commit interval carried from before a
	// division (the split's own, or its parent's for a child), used
	// until two records of this state measure them.
	pace pace
}

// pace is a split's rate in weight units per ms and its commit interval
// in ms (zero: not known).
type pace struct {
	rate     float64
	interval int64
}

// rate is the split's rate in weight units per ms (0: not known): measured
// in this state, else carried from before its division.
func (s *rateSample) rate() float64 {
	if s.lastAt <= s.firstAt || s.firstRem <= s.lastRem {
		return s.pace.rate
	}
	return float64(s.firstRem-s.lastRem) / float64(s.lastAt-s.firstAt)
}

// commitInterval is the split's commit interval in ms (0: not known):
// measured in this state, else carried.
func (s *rateSample) commitInterval() int64 {
	if s.interval > 0 {
		return s.interval
	}
	return s.pace.interval
}

// measured is what a new state of the split starts from: its pace so far.
func (s *rateSample) measured() pace {
	return pace{rate: s.rate(), interval: s.commitInterval()}
}

// askRecord is one ask the leader made.
type askRecord struct {
	owner    string
	epoch    uint64
	children int
	pieces   int
	until    time.Time // the ask stands until then
	times    int       // asks in this state (epoch, children)
	// early: asked before the split's first commit, when its owner's
	// lane may not be reading yet (it declines): it may be asked once
	// more after that commit.
	early bool
}

// divideTrigger is the leader's state of the trigger.
type divideTrigger struct {
	term    *leadership
	samples map[string]*rateSample
	// inherited is the pace of a divided split, kept for its children
	// until their first records are seen.
	inherited map[string]pace
	asked     map[string]*askRecord
	idle      int // free lanes in the last assignment computed
	// idleMembers is the members the last assignment gave no split: one
	// ask asks for a child for each of them (divideAsk.Pieces).
	idleMembers int
	unplaced    int // splits the last assignment left without a member
	// ownerless is the splits the last assignment placed that had no
	// owner: one that is not among them (a child created since) will
	// take a member counted idle.
	ownerless map[string]bool
	next      time.Time
	// pending: the last scan found a split to ask for but waited (for a
	// child's creation or the assignment's publishing): the loop is woken
	// for the next scan.
	pending bool
}

// noteAssignment records what the assignment just computed leaves: the
// free lanes of the live members and the splits placed nowhere.
func (t *divideTrigger) noteAssignment(in assignIn, result map[string][]string) {
	t.idle, t.idleMembers, t.unplaced = 0, 0, len(in.Splits)
	clear(t.ownerless)
	for _, sp := range in.Splits {
		if sp.Owner == "" {
			if t.ownerless == nil {
				t.ownerless = map[string]bool{}
			}
			t.ownerless[sp.ID] = true
		}
	}
	for _, m := range in.Members {
		t.idle += max(0, max(m.Budget, 1)-len(result[m.ID]))
		if len(result[m.ID]) == 0 {
			t.idleMembers++
		}
	}
	for _, ids := range result {
		t.unplaced -= len(ids)
	}
}

// askDivisions, on the leader, measures the running splits while every
// split is placed, and asks for the divisions worth making while members
// hold nothing; a change of the asks marks the assignment dirty, so that
// publishing writes them.
func (a *actor) askDivisions(now time.Time) {
	t := &a.leader.div
	if t.term != a.leader.term {
		*t = divideTrigger{term: a.leader.term, samples: map[string]*rateSample{}, inherited: map[string]pace{}, asked: map[string]*askRecord{}}
	}
	if t.unplaced > 0 {
		clear(t.samples) // measured afresh when every split has a member
		return
	}
	if now.Before(t.next) {
		if t.pending {
			a.wake.arm(t.next) // an ask is due: do not wait for a commit
		}
		return
	}
	t.next = now.Add(divideScanPace)
	t.pending = false
	changed := false
	type candidate struct {
		id, owner string
		ert       float64 // ms; 0: no rate known (ranked by rem)
		rem       uint64
		s         *rateSample
		pieces    int
	}
	var cands []candidate
	outstanding := 0
	for id := range t.samples {
		if v := a.job.splits[id]; v == nil || v.prog == nil || v.prog.Completed || v.prog.Status != statusRunnable {
			delete(t.samples, id)
		}
	}
	for id := range t.inherited {
		if v := a.job.splits[id]; v != nil && v.prog != nil && v.prog.Completed {
			delete(t.inherited, id)
		}
	}
	for id, ask := range t.asked {
		v := a.job.splits[id]
		switch {
		case v == nil || v.prog == nil || v.prog.Completed || v.prog.Epoch != ask.epoch || len(v.prog.Children) != ask.children:
			delete(t.asked, id) // answered, moved or done
			changed = true
		case now.Before(ask.until):
			outstanding += max(ask.pieces, 1)
		}
	}
	var rates []float64 // the measured rates, for the splits with none
	unplacedSince := 0  // splits with no owner the last assignment did not see
	for id, v := range a.job.splits {
		p := v.prog
		if p == nil || p.Completed || p.Status != statusRunnable || v.spec == nil {
			continue
		}
		if v.lease == nil && !t.ownerless[id] {
			unplacedSince++
		}
		rem := p.Remaining
		if rem == 0 && p.Watermark == nil {
			// Not committed yet (just claimed): all of what it owns is
			// left, so an idle member is fed at once instead of a
			// commit interval or two later.
			_, rem = v.own()
		}
		if rem == 0 {
			continue // a source that cannot divide: never asked
		}
		owner := p.owner()
		if v.lease == nil || v.lease.Owner != owner || owner == "" {
			continue // not held by its recorded owner (a claim or a move under way)
		}
		if _, live := a.members.presence[owner]; !live {
			continue
		}
		s := t.samples[id]
		var fresh *rateSample
		switch {
		case s != nil && s.epoch == p.Epoch && len(p.Children) > s.children:
			// Its owner divided it: what it gave up was not read, and
			// it and its new children go on at its pace.
			carried := s.measured()
			for _, c := range p.Children[s.children:] {
				t.inherited[c.ID] = carried
			}
			fresh = &rateSample{pace: carried}
		case s == nil || s.epoch != p.Epoch || s.children != len(p.Children) || rem > s.lastRem:
			// A new split (a child starts at its parent's pace), a new
			// tenancy, or a record that went back: measured afresh.
			fresh = &rateSample{pace: t.inherited[id]}
		case p.WrittenAtMs > s.lastAt:
			s.interval = p.WrittenAtMs - s.lastAt
			s.lastRem, s.lastAt = rem, p.WrittenAtMs
		}
		if fresh != nil {
			fresh.epoch, fresh.children = p.Epoch, len(p.Children)
			fresh.firstRem, fresh.firstAt, fresh.lastRem, fresh.lastAt = rem, p.WrittenAtMs, rem, p.WrittenAtMs
			s = fresh
			t.samples[id] = s
			delete(t.inherited, id)
		}
		if s.lastRem < 2 {
			continue
		}
		r, interval := s.rate(), s.commitInterval()
		var ert float64
		if r > 0 {
			rates = append(rates, r)
			ert = float64(s.lastRem) / r // ms
			if interval > 0 && ert <= float64(divideWorth*interval) {
				continue
			}
		}
		if ask := t.asked[id]; ask != nil && (now.Before(ask.until) || ask.times >= maxAsksPerState && !(ask.early && p.Watermark != nil)) {
			continue // asked in this state (an ask made before the first commit may be made once more after it)
		}
		cands = append(cands, candidate{id: id, owner: owner, ert: ert, rem: s.lastRem, s: s})
	}
	// Ask only while members hold nothing, and for no more pieces than
	// there are such members not yet asked for: a member that holds a
	// split has no time to spare when its lanes share one pace (backfill's
	// --rate), and a child given to it was moved again. A child not
	// created yet, or an assignment not computed since a change, would
	// give a member counted idle a split: wait for them (not for the
	// claims: a placed child's member is not counted idle).
	free := t.idleMembers - outstanding
	if free <= 0 || len(a.division.parents) > 0 || unplacedSince > 0 {
		if free > 0 && len(cands) > 0 {
			t.pending = true
			if len(a.division.parents) == 0 {
				t.next = now // the assignment is published first: scan again then
			}
		}
		cands = nil
	}
	// A split with no rate yet (not committed twice) is timed at the
	// fleet's median measured rate, or ranked by what it has left when no
	// split has a rate; its source declines a remainder too small.
	if len(rates) > 0 {
		slices.Sort(rates)
		median := rates[len(rates)/2]
		for i := range cands {
			if cands[i].ert == 0 {
				cands[i].ert = float64(cands[i].rem) / median
			}
		}
	}
	slices.SortFunc(cands, func(x, y candidate) int {
		return cmp.Or(cmp.Compare(y.ert, x.ert), cmp.Compare(y.rem, x.rem), cmp.Compare(x.id, y.id))
	})
	// The free members' pieces go one at a time to the split that would
	// still take longest: a split given k pieces expects ert/(k+1).
	for range free {
		best := -1
		for i := range cands {
			c := &cands[i]
			if c.pieces >= maxChildren-len(a.job.splits[c.id].prog.Children) {
				continue
			}
			if best < 0 || c.ert/float64(c.pieces+1) > cands[best].ert/float64(cands[best].pieces+1) ||
				c.ert == 0 && cands[best].ert == 0 && c.rem/uint64(c.pieces+1) > cands[best].rem/uint64(cands[best].pieces+1) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		cands[best].pieces++
	}
	for _, c := range cands {
		if c.pieces == 0 {
			continue
		}
		v := a.job.splits[c.id]
		ask := t.asked[c.id]
		if ask == nil {
			ask = &askRecord{owner: c.owner, epoch: v.prog.Epoch, children: len(v.prog.Children)}
			t.asked[c.id] = ask
		}
		// One round feeds every idle member: the owner keeps
		// 1/(pieces+1) of what it has not read and gives up the rest
		// as pieces children, instead of one child a round.
		ask.pieces = c.pieces
		if ask.early && v.prog.Watermark != nil {
			ask.times = 0 // the ask before the first commit found no lane reading yet
		}
		ask.early = v.prog.Watermark == nil
		ask.times++
		stands := time.Duration(divideCooldown*c.s.commitInterval()) * time.Millisecond
		if stands <= 0 {
			stands = askStands // no commit interval measured yet
		}
		ask.until = now.Add(stands)
		outstanding += ask.pieces
		changed = true
		a.m.divisionAsks.Inc()
		a.log.Info("asking a split's owner to divide it: workers idle and it has the longest expected remaining time",
			"split", c.id, "owner", c.owner, "remaining", c.s.lastRem,
			"expected_remaining", (time.Duration(c.ert) * time.Millisecond).Round(time.Millisecond),
			"idle_members", t.idleMembers, "pieces", ask.pieces)
	}
	if changed {
		a.dirty = true
	}
}

// asksFor is the asks that member inst's assignment record carries: the
// standing ones for the splits it holds, in split order.
func (t *divideTrigger) asksFor(now time.Time) map[string][]divideAsk {
	out := map[string][]divideAsk{}
	for _, id := range slices.Sorted(maps.Keys(t.asked)) {
		ask := t.asked[id]
		if now.Before(ask.until) {
			pieces := ask.pieces
			if pieces <= 1 {
				pieces = 0 // omitted: a one-piece ask reads as before
			}
			out[ask.owner] = append(out[ask.owner], divideAsk{Split: id, Epoch: ask.epoch, Children: ask.children, Pieces: pieces})
		}
	}
	return out
}

// ----- the owner ------------------------------------------------------------------

// workerAsks is what the worker has seen of the leader's asks.
type workerAsks struct {
	seen map[string]divideAsk // split → the last ask noted
	due  []divideAsk          // asks not yet acted on
}

// adopt notes the asks of a newly adopted assignment record.
func (w *workerAsks) adopt(asks []divideAsk) {
	for _, ask := range asks {
		if w.seen[ask.Split] == ask {
			continue
		}
		if w.seen == nil {
			w.seen = map[string]divideAsk{}
		}
		w.seen[ask.Split] = ask
		w.due = append(w.due, ask)
	}
}

// serveAsks emits DivideRequested for each due ask of a split this worker
// holds whose record still names the children it named when asked.
func (a *actor) serveAsks() {
	due := a.worker.asks.due
	if len(due) == 0 {
		return
	}
	a.worker.asks.due = nil
	for _, ask := range due {
		if t, held := a.worker.owned[ask.Split]; !held || t.epoch != ask.Epoch {
			continue
		}
		v := a.job.splits[ask.Split]
		if v == nil || v.prog == nil || len(v.prog.Children) != ask.Children {
			continue
		}
		a.c.emit(DivideRequested{Split: SplitID{id: ask.Split}, Pieces: max(ask.Pieces, 1)})
	}
	for id := range a.worker.asks.seen {
		if _, held := a.worker.owned[id]; !held && !a.worker.assigned[id] {
			delete(a.worker.asks.seen, id)
		}
	}
}
