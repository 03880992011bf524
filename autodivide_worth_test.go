package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The trigger's threshold (docs/decisions/043): with a lane idle and
// nothing unplaced, a running split whose expected remaining time is more
// than one of its commit intervals is asked for, so the fleet's last
// worker finishes within about one commit interval of the others; one
// that expects less than a commit interval is left alone. A threshold of
// two intervals left a 1.1-interval remainder on one worker while the
// others idled (a finish spread of up to 1.5 s at backfill's 1 s commit
// interval with --min-splits 1).
func TestTheTriggerAsksForARemainderOfMoreThanOneCommitInterval(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after uint64 // what is left one commit interval (1 s) after 3000
		asked bool
	}{
		// 1400 units/s: 1600 left is 1.14 s.
		{"1.14 intervals left", 1600, true},
		// 1600 units/s: 1400 left is 0.875 s.
		{"0.875 intervals left", 1400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestActor(t, newFakeStore(), testConfig())
			a.leader.term = &leadership{generation: 1}
			a.members.presence["owner"] = presenceEntry{rev: 1}
			a.members.presence["idle"] = presenceEntry{rev: 2}
			owner := "owner"
			v := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: "s", Weight: 3000},
				lease: &leaseVal{Schema: SchemaVersion, Owner: owner, Epoch: 1},
				prog: &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Owner: &owner,
					Remaining: 3000, WrittenAtMs: 10_000}}
			a.job.splits["s"] = v
			now := time.Now()
			a.askDivisions(now) // the trigger's state starts with the leader's term
			// The first record, measured while every member holds a
			// split (the trigger measures then too, and asks nothing).
			a.leader.div.idle, a.leader.div.idleMembers, a.leader.div.unplaced = 7, 0, 0
			a.askDivisions(now)
			require.Empty(t, a.leader.div.asked)
			next := *v.prog
			next.Remaining, next.WrittenAtMs = tc.after, 11_000
			v.prog = &next
			a.leader.div.idle, a.leader.div.idleMembers = 8, 1 // the other member ran out of work
			a.askDivisions(now.Add(time.Second))
			if tc.asked {
				assert.Contains(t, a.leader.div.asked, "s", "a remainder of more than one commit interval is divided")
			} else {
				assert.Empty(t, a.leader.div.asked, "a remainder of less than one commit interval is not worth a division")
			}
		})
	}
}

// A division does not restart the trigger's measurement: the divided
// split keeps its pace and its child starts with it, so when lanes are
// still idle both can be asked as soon as the child runs, without two more
// commits each. Before, both started with no rate; a child claimed in the
// job's last seconds was never asked (its remainder fell under the
// threshold before two of its records measured it), which left a finish
// spread of up to 1.5 s with runtime division alone (scripts/fleet-bench.sh,
// --min-splits 1). No split is asked while the child waits for its first
// claim: it takes a lane the last assignment counted free.
func TestADividedSplitAndItsChildKeepTheirPace(t *testing.T) {
	a := newTestActor(t, newFakeStore(), testConfig())
	a.leader.term = &leadership{generation: 1}
	for i, m := range []string{"owner", "idle", "idle2", "idle3"} {
		a.members.presence[m] = presenceEntry{rev: uint64(i + 1)}
	}
	owner, child := "owner", "s_d3500"
	// Four members of one lane each; the assignment computed when members
	// hold the given splits.
	members := []assignMember{{ID: "owner", Budget: 1}, {ID: "idle", Budget: 1}, {ID: "idle2", Budget: 1}, {ID: "idle3", Budget: 1}}
	assigned := func(result map[string][]string) {
		var splits []assignSplit
		for _, ids := range result {
			for _, id := range ids {
				splits = append(splits, assignSplit{ID: id})
			}
		}
		a.leader.div.noteAssignment(assignIn{Members: members, Splits: splits}, result)
	}
	v := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: "s", Weight: 6000},
		lease: &leaseVal{Schema: SchemaVersion, Owner: owner, Epoch: 1},
		prog: &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Owner: &owner,
			Remaining: 6000, WrittenAtMs: 10_000}}
	a.job.splits["s"] = v
	now := time.Now()
	a.askDivisions(now)
	// The first record, while the other members read splits of their own.
	assigned(map[string][]string{"owner": {"s"}, "idle": {"x"}, "idle2": {"y"}, "idle3": {"z"}})
	a.askDivisions(now)
	require.Empty(t, a.leader.div.asked)
	// One commit interval (1 s) later 1000 units were read: 1 unit/ms;
	// one member ran out of work.
	next := *v.prog
	next.Remaining, next.WrittenAtMs = 5000, 11_000
	v.prog = &next
	assigned(map[string][]string{"owner": {"s"}, "idle2": {"y"}, "idle3": {"z"}})
	now = now.Add(time.Second)
	a.askDivisions(now)
	require.Contains(t, a.leader.div.asked, "s", "5 s left at 1 unit/ms is worth a division")

	// The owner divides at 3500: it keeps 2500 and names the child.
	divided := next
	divided.Remaining, divided.WrittenAtMs = 2500, 11_100
	divided.Children = []childSplit{{ID: child, Position: 3500, Weight: 2500}}
	v.prog = &divided
	a.division.noteChildren("s", v.prog)
	now = now.Add(300 * time.Millisecond) // past divideScanPace
	a.askDivisions(now)
	assert.NotContains(t, a.leader.div.asked, "s", "the answered ask is dropped")
	assert.Empty(t, a.leader.div.asked, "nothing is asked while the child is not created: it takes the idle lane")

	// The leader created the child; it is not claimed yet.
	delete(a.division.parents, "s")
	cv := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: child, Weight: 2500},
		prog: &progressRecord{Schema: SchemaVersion, ID: child, Status: statusRunnable}}
	a.job.splits[child] = cv
	assigned(map[string][]string{"owner": {"s"}, "idle": {child}, "idle2": {"y"}, "idle3": {"z"}})
	now = now.Add(300 * time.Millisecond) // past divideScanPace
	a.askDivisions(now)
	assert.Empty(t, a.leader.div.asked, "nothing is asked while the child, placed on the idle member, waits for its claim")

	// The idle member claimed it (its first record, on its own clock),
	// and two more members ran out of work: neither split has committed
	// since, yet both are worth dividing at the pace they carry (2.5 s
	// left each).
	idle := "idle"
	cv.lease = &leaseVal{Schema: SchemaVersion, Owner: idle, Epoch: 1}
	cv.prog = &progressRecord{Schema: SchemaVersion, ID: child, Epoch: 1, Status: statusRunnable, Owner: &idle,
		Remaining: 2500, WrittenAtMs: 90_000}
	assigned(map[string][]string{"owner": {"s"}, "idle": {child}})
	now = now.Add(300 * time.Millisecond) // past divideScanPace
	a.askDivisions(now)
	assert.Contains(t, a.leader.div.asked, "s", "the divided split keeps its pace")
	assert.Contains(t, a.leader.div.asked, child, "the child starts at its parent's pace")
}

// One ask feeds every idle member (docs/decisions/043, "One ask, as many
// pieces as idle members"): with two of three members holding nothing, the
// ask for the one running split asks for two children, and its owner's
// assignment record carries it. Before, an ask made one child and the
// next waited for that child's claim, so a big split was halved about once
// a commit interval while members idled (the fleet's finish 1.35× the even
// reference with runtime division alone, scripts/fleet-bench.sh).
func TestOneAskFeedsEveryIdleMember(t *testing.T) {
	a := newTestActor(t, newFakeStore(), testConfig())
	a.leader.term = &leadership{generation: 1}
	for i, m := range []string{"owner", "idle", "idle2"} {
		a.members.presence[m] = presenceEntry{rev: uint64(i + 1)}
	}
	owner := "owner"
	v := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: "s", Weight: 6000},
		lease: &leaseVal{Schema: SchemaVersion, Owner: owner, Epoch: 1},
		prog: &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Owner: &owner,
			Remaining: 6000, WrittenAtMs: 10_000}}
	a.job.splits["s"] = v
	now := time.Now()
	a.askDivisions(now) // the trigger's state starts with the leader's term
	in := assignIn{Members: []assignMember{{ID: "owner", Budget: 8}, {ID: "idle", Budget: 8}, {ID: "idle2", Budget: 8}},
		Splits: []assignSplit{{ID: "s"}}}
	// The first record, measured while the others read splits of their own.
	a.leader.div.noteAssignment(in, map[string][]string{"owner": {"s"}, "idle": {"t"}, "idle2": {"u"}})
	a.askDivisions(now)
	require.Empty(t, a.leader.div.asked)
	// Three members of 8 lanes; the assignment gives the one split to its
	// owner: 23 free lanes, two members with nothing.
	a.leader.div.noteAssignment(in, map[string][]string{"owner": {"s"}})
	require.Equal(t, 2, a.leader.div.idleMembers)
	next := *v.prog
	next.Remaining, next.WrittenAtMs = 5000, 11_000
	v.prog = &next
	now = now.Add(time.Second)
	a.askDivisions(now)
	require.Contains(t, a.leader.div.asked, "s")
	assert.Equal(t, 2, a.leader.div.asked["s"].pieces, "one piece for each member with nothing to do")
	assert.Equal(t, map[string][]divideAsk{"owner": {{Split: "s", Epoch: 1, Children: 0, Pieces: 2}}},
		a.leader.div.asksFor(now), "the owner's assignment record carries the pieces")

	// One member idle: a one-piece ask, written as before (no pieces).
	a.leader.div = divideTrigger{}
	a.askDivisions(now)
	a.leader.div.noteAssignment(in, map[string][]string{"owner": {"s"}, "idle": {"t"}})
	require.Equal(t, 1, a.leader.div.idleMembers)
	a.askDivisions(now)
	v.prog = &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Owner: &owner,
		Remaining: 4000, WrittenAtMs: 12_000}
	a.askDivisions(now.Add(time.Second))
	require.Contains(t, a.leader.div.asked, "s")
	assert.Equal(t, 1, a.leader.div.asked["s"].pieces)
	assert.Equal(t, map[string][]divideAsk{"owner": {{Split: "s", Epoch: 1}}}, a.leader.div.asksFor(now.Add(time.Second)))
}
