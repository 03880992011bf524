package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleFixture is a leader with members of 8 lanes each and running
// splits held by their owners, whose assignment the test states.
type idleFixture struct {
	a       *actor
	members []assignMember
	now     time.Time
}

func newIdleFixture(t *testing.T, members ...string) *idleFixture {
	a := newTestActor(t, newFakeStore(), testConfig())
	a.leader.term = &leadership{generation: 1}
	f := &idleFixture{a: a, now: time.Now()}
	for i, m := range members {
		a.members.presence[m] = presenceEntry{rev: uint64(i + 1)}
		f.members = append(f.members, assignMember{ID: m, Budget: 8})
	}
	a.askDivisions(f.now) // the trigger's state starts with the leader's term
	return f
}

// run adds split id of weight held by owner at epoch 1: claimed and not
// committed yet when remaining is 0, else last committed at writtenAt
// (the owner's clock, ms) with remaining left.
func (f *idleFixture) run(id, owner string, weight, remaining uint64, writtenAt int64) *splitView {
	p := &progressRecord{Schema: SchemaVersion, ID: id, Epoch: 1, Status: statusRunnable, Owner: &owner,
		Remaining: remaining, WrittenAtMs: writtenAt}
	if remaining > 0 {
		wm := int64(weight - remaining)
		p.Watermark = &wm
	}
	v := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: id, Weight: weight},
		lease: &leaseVal{Schema: SchemaVersion, Owner: owner, Epoch: 1}, prog: p}
	f.a.job.splits[id] = v
	return v
}

// commit records a commit of v's owner: remaining left at writtenAt.
func (f *idleFixture) commit(v *splitView, remaining uint64, writtenAt int64) {
	next := *v.prog
	wm := int64(v.spec.Weight - remaining)
	next.Remaining, next.WrittenAtMs, next.Watermark = remaining, writtenAt, &wm
	v.prog = &next
}

// assigned states the assignment the leader computed.
func (f *idleFixture) assigned(result map[string][]string) {
	var splits []assignSplit
	for _, ids := range result {
		for _, id := range ids {
			splits = append(splits, assignSplit{ID: id})
		}
	}
	f.a.leader.div.noteAssignment(assignIn{Members: f.members, Splits: splits}, result)
}

// scan runs the trigger after d more.
func (f *idleFixture) scan(d time.Duration) {
	f.now = f.now.Add(d)
	f.a.askDivisions(f.now)
}

func (f *idleFixture) pieces() map[string]int {
	out := map[string]int{}
	for id, ask := range f.a.leader.div.asked {
		out[id] = ask.pieces
	}
	return out
}

// A member that holds nothing is fed at once (docs/decisions/043, "Asked
// at once"): the split just claimed, not committed yet, is asked for with
// all it owns as its remainder, without waiting for two commits to
// measure its rate. Before, a split was asked for only once two of its
// records had measured a rate: the first ask came about 1.7 s (two commit
// intervals) into a fleet's job while a worker idled from the start
// (scripts/fleet-bench.sh, the skewed input with --min-splits 1).
func TestAnIdleMemberIsFedBeforeTheFirstCommit(t *testing.T) {
	f := newIdleFixture(t, "w1", "w2", "w3")
	f.run("big", "w1", 6_000_000, 0, 10_000)
	f.run("small", "w2", 1_000_000, 0, 10_000)
	f.assigned(map[string][]string{"w1": {"big"}, "w2": {"small"}})
	f.scan(time.Second)
	assert.Equal(t, map[string]int{"big": 1}, f.pieces(), "the split with the most left feeds the idle member")
	assert.Equal(t, map[string][]divideAsk{"w1": {{Split: "big", Epoch: 1}}}, f.a.leader.div.asksFor(f.now),
		"the ask stands though no commit interval is measured yet")
}

// No ask goes out while every member holds a split, however many lanes
// are free: the members' lanes share one pace when the worker is paced
// (backfill's --rate), and a child given to a busy member was moved
// again. As soon as one holds nothing, the split measured meanwhile is
// asked for. Before, free lanes were asked for: three members of 8 lanes
// each holding one split counted 21.
func TestNoAskWhileEveryMemberHoldsASplit(t *testing.T) {
	f := newIdleFixture(t, "w1", "w2", "w3")
	a := f.run("a", "w1", 9000, 9000, 10_000)
	b := f.run("b", "w2", 9000, 9000, 10_000)
	c := f.run("c", "w3", 3000, 3000, 10_000)
	f.assigned(map[string][]string{"w1": {"a"}, "w2": {"b"}, "w3": {"c"}})
	require.Equal(t, 21, f.a.leader.div.idle)
	f.scan(0)
	for i, now := range []int64{11_000, 12_000} {
		f.commit(a, 8000-uint64(i)*1000, now)
		f.commit(b, 8000-uint64(i)*1000, now)
		f.commit(c, 2000-uint64(i)*1000, now)
		f.scan(time.Second)
	}
	assert.Empty(t, f.a.leader.div.asked, "asked while every member held a split: 7 s left on a, no member free")

	delete(f.a.job.splits, "c") // completed
	f.assigned(map[string][]string{"w1": {"a"}, "w2": {"b"}})
	f.scan(time.Second)
	assert.Equal(t, map[string]int{"a": 1}, f.pieces(), "the member that ran out of work is fed at once, measured before")
}

// The idle members' pieces go to the splits that would take longest:
// one each to two splits of about equal expected time, both to one far
// longer than the other. Before, each of the two splits was asked for as
// many pieces as there were idle members (four children for two idle
// members), or, on main, one each whatever their times.
func TestIdleMembersArePiecesOfTheLongestSplits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leftB  uint64 // b's remainder; a has 10000, both at 1 unit/ms
		pieces map[string]int
	}{
		{"about equal", 9000, map[string]int{"a": 1, "b": 1}},
		{"one far longer", 3000, map[string]int{"a": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdleFixture(t, "w1", "w2", "w3", "w4")
			a := f.run("a", "w1", 20_000, 11_000, 10_000)
			b := f.run("b", "w2", 20_000, tc.leftB+1000, 10_000)
			f.assigned(map[string][]string{"w1": {"a"}, "w2": {"b"}, "w3": {"x"}, "w4": {"y"}})
			f.scan(0)
			f.commit(a, 10_000, 11_000)
			f.commit(b, tc.leftB, 11_000)
			f.assigned(map[string][]string{"w1": {"a"}, "w2": {"b"}})
			f.scan(time.Second)
			assert.Equal(t, tc.pieces, f.pieces())
		})
	}
}

// A child created and placed on an idle member, but not claimed yet, does
// not hold back the next ask: the assignment already gave it to its
// member, and another member still holds nothing. Before, no split was
// asked for while any split waited for its claim, so each level of
// division waited for its children's claims.
func TestAPlacedChildDoesNotHoldBackTheNextAsk(t *testing.T) {
	f := newIdleFixture(t, "w1", "w2", "w3")
	big := f.run("big", "w1", 20_000, 20_000, 10_000)
	other := f.run("other", "w2", 20_000, 20_000, 10_000)
	f.assigned(map[string][]string{"w1": {"big"}, "w2": {"other"}, "w3": {"z"}})
	f.scan(0)
	f.commit(big, 19_000, 11_000)
	f.commit(other, 19_000, 11_000)
	// A child of another split (z) was created and placed on w3, which
	// has not claimed it yet: w3 counts as busy. Then w2's split
	// completes: w2 holds nothing.
	child := "z_d500"
	f.a.job.splits[child] = &splitView{spec: &specRecord{Schema: SchemaVersion, ID: child, Weight: 500},
		prog: &progressRecord{Schema: SchemaVersion, ID: child, Status: statusRunnable}}
	delete(f.a.job.splits, "other")
	f.assigned(map[string][]string{"w1": {"big"}, "w3": {child}})
	f.scan(time.Second)
	assert.Equal(t, map[string]int{"big": 1}, f.pieces(), "w2 is fed though w3's child is not claimed yet")
}

// A division's record says what the primary has left: the last commit's
// remainder less the residual's weight. Before, it kept the remainder of
// the whole split, so the trigger measured the residual as read at the
// next commit: a rate several times the split's own, and the divided split
// was not asked for again while members idled.
func TestADivisionRecordsWhatThePrimaryHasLeft(t *testing.T) {
	wm := int64(1000)
	r := &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Watermark: &wm, Remaining: 5000}
	rec := dividedRecord(r, "s_d3500", &Division{Position: 3500, Primary: []byte("p"), PrimaryWeight: 3500,
		Residual: []byte("r"), ResidualWeight: 2500})
	assert.EqualValues(t, 2500, rec.Remaining, "the primary's unread part")
	assert.EqualValues(t, 5000, r.Remaining, "the record divided is not changed")

	// The trigger's rate across the division is the owner's own.
	f := newIdleFixture(t, "w1", "w2", "w3")
	v := f.run("s", "w1", 6000, 6000, 10_000)
	f.assigned(map[string][]string{"w1": {"s"}, "w2": {"x"}, "w3": {"y"}})
	f.scan(0)
	f.commit(v, 5000, 11_000) // 1 unit/ms
	f.scan(time.Second)
	v.prog = dividedRecord(v.prog, "s_d3500", &Division{Position: 3500, Primary: []byte("p"), PrimaryWeight: 3500,
		Residual: []byte("r"), ResidualWeight: 2500})
	v.prog.WrittenAtMs = 11_100
	f.scan(time.Second)
	f.commit(v, 1500, 12_100) // 1000 read in the second since the division
	f.scan(time.Second)
	assert.InDelta(t, 1.0, f.a.leader.div.samples["s"].rate(), 0.01, "units/ms: what the owner read, not what it gave up")
}
