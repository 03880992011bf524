package spate

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// lv builds a split view for the leader: a progress record with the given
// status and durable owner, a spec of the given weight (0: no spec), and a
// live lease held by lease ("" for none).
func lv(status, owner string, weight uint64, lease string) *splitView {
	r := rec("x", 1, owner)
	r.Status = status
	v := &splitView{prog: r}
	if weight > 0 {
		v.spec = &specRecord{Schema: SchemaVersion, Weight: weight, Descriptor: []byte{}}
	}
	if lease != "" {
		v.lease = &leaseVal{Schema: SchemaVersion, Owner: lease, Nonce: "n-" + lease, Epoch: 1}
	}
	return v
}

func present(ids ...string) map[string]presenceEntry {
	m := map[string]presenceEntry{}
	for i, id := range ids {
		m[id] = presenceEntry{rev: uint64(i + 1)}
	}
	return m
}

func assigned(gen uint64, ids ...string) assignEntry {
	return assignEntry{val: &assignmentVal{Schema: SchemaVersion, Generation: gen, Splits: ids}, rev: 1}
}

func TestAssignInputMembersAndBudgets(t *testing.T) {
	in := inputOf(leaderView{
		presence:    present("c", "a", "b", "d"),
		caps:        map[string]int{"a": 3, "b": 0, "gone": 9},
		maxInFlight: 5,
		seed:        42,
	})
	assert.Equal(t, []assignMember{{ID: "a", Budget: 3}, {ID: "b", Budget: 5}, {ID: "c", Budget: 5}, {ID: "d", Budget: 5}}, in.Members,
		"members are the live instances, sorted; an advertised cap > 0 is the budget, else the configured MaxInFlight")
	assert.Equal(t, uint64(42), in.Seed, "the seed is the job's, passed through")
	assert.Empty(t, in.Splits)
}

func TestAssignInputPoolAndOwners(t *testing.T) {
	cases := []struct {
		name      string
		split     *splitView
		assigns   map[string]assignEntry
		wantIn    bool
		wantOwner string
		pinned    bool
	}{
		{name: "durable owner live, no lease", split: lv(statusRunnable, "a", 2, ""), wantIn: true, wantOwner: "a"},
		{name: "live lease owner beats the durable owner", split: lv(statusRunnable, "a", 2, "b"), wantIn: true, wantOwner: "b"},
		{name: "a lease held by a non-member counts as no holder", split: lv(statusRunnable, "dead", 2, "ghost"),
			wantIn: true, wantOwner: ""},
		{name: "in flight: a lease held by a non-member, named by a live member", split: lv(statusRunnable, "dead", 2, "ghost"),
			assigns: map[string]assignEntry{"b": assigned(1, "s")}, wantIn: true, wantOwner: "b", pinned: true},
		{name: "in flight: a live holder draining it toward the member whose record names it", split: lv(statusRunnable, "a", 2, ""),
			assigns: map[string]assignEntry{"b": assigned(1, "s")}, wantIn: true, wantOwner: "b", pinned: true},
		{name: "landed: the holder is the member whose record names it", split: lv(statusRunnable, "b", 2, "b"),
			assigns: map[string]assignEntry{"b": assigned(1, "s")}, wantIn: true, wantOwner: "b"},
		{name: "in flight: no lease, dead owner, named by a live member", split: lv(statusRunnable, "dead", 2, ""),
			assigns: map[string]assignEntry{"b": assigned(1, "s")}, wantIn: true, wantOwner: "b", pinned: true},
		{name: "in flight: no lease, released (no owner), named by a live member", split: lv(statusRunnable, "", 2, ""),
			assigns: map[string]assignEntry{"a": assigned(1, "other"), "b": assigned(1, "s", "t")}, wantIn: true, wantOwner: "b", pinned: true},
		{name: "named only by a member that is not live: ownerless", split: lv(statusRunnable, "dead", 2, ""),
			assigns: map[string]assignEntry{"dead": assigned(1, "s")}, wantIn: true, wantOwner: ""},
		{name: "no lease, dead owner, named by nobody: ownerless", split: lv(statusRunnable, "dead", 2, ""), wantIn: true, wantOwner: ""},
		{name: "completed status is out of the pool", split: lv(statusCompleted, "a", 2, "")},
		{name: "quarantined is out of the pool", split: lv(statusQuarant, "", 2, "")},
		{name: "a completed flag is out of the pool even while runnable", split: func() *splitView {
			v := lv(statusRunnable, "a", 2, "a")
			v.prog.Completed = true
			return v
		}()},
		{name: "spec-less is out of the pool", split: lv(statusRunnable, "a", 0, "a")},
		{name: "no progress record yet (a lease or spec seen first) is out of the pool",
			split: &splitView{spec: &specRecord{Weight: 1}, lease: &leaseVal{Owner: "a"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := inputOf(leaderView{
				splits:      map[string]*splitView{"s": c.split},
				presence:    present("a", "b"),
				assigns:     c.assigns,
				departed:    map[string]time.Time{},
				delay:       20 * time.Second,
				maxInFlight: 4,
			})
			if !c.wantIn {
				assert.Empty(t, in.Splits)
				return
			}
			require.Len(t, in.Splits, 1)
			assert.Equal(t, assignSplit{ID: "s", Weight: 2, Owner: c.wantOwner, Pinned: c.pinned}, in.Splits[0])
		})
	}
}

// A split its live holder parked (its input is idle) stays with it and
// takes none of its budget: a split waiting for a lane is given that lane
// beside it. A parked split whose holder is gone, or that was released,
// is in the pool like any other.
func TestAParkedHeldSplitTakesNoLane(t *testing.T) {
	parked := func(owner, lease string) *splitView {
		v := lv(statusRunnable, owner, 5, lease)
		v.prog.Parked = true
		return v
	}
	in := inputOf(leaderView{
		splits: map[string]*splitView{
			"idle": parked("a", "a"), "live": lv(statusRunnable, "", 1, ""),
			"orphan": parked("dead", "dead"), "released": parked("", ""),
		},
		presence:    present("a"),
		departed:    map[string]time.Time{},
		maxInFlight: 1,
	})
	assert.Equal(t, map[string][]string{"a": {"idle"}}, in.Parked)
	var pool []string
	for _, s := range in.Splits {
		pool = append(pool, s.ID)
	}
	assert.ElementsMatch(t, []string{"live", "orphan", "released"}, pool)
	in = inputOf(leaderView{
		splits:      map[string]*splitView{"idle": parked("a", "a"), "live": lv(statusRunnable, "", 1, "")},
		presence:    present("a"),
		departed:    map[string]time.Time{},
		maxInFlight: 1,
	})
	got := withParked(computeAssignment(in), in.Parked)
	assert.Equal(t, map[string][]string{"a": {"idle", "live"}}, got,
		"with one lane, the waiting split is given it beside the parked one")
}

func TestAssignInputDepartedOwnerHeldBackOnlyInsideTheWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	view := func(departed map[string]time.Time, delay time.Duration) assignIn {
		return inputOf(leaderView{
			splits: map[string]*splitView{
				"bounced": lv(statusRunnable, "d", 1, ""),
				"mine":    lv(statusRunnable, "a", 1, ""),
				"free":    lv(statusRunnable, "", 1, ""),
			},
			presence:    present("a"),
			departed:    departed,
			delay:       delay,
			maxInFlight: 4,
		})
	}
	ids := func(in assignIn) []string {
		var out []string
		for _, s := range in.Splits {
			out = append(out, s.ID+"@"+s.Owner)
		}
		return out
	}

	// Inside the window: the departed owner's split is withheld, nothing else.
	inside := view(map[string]time.Time{"d": now}, 20*time.Second)
	assert.Equal(t, []string{"free@", "mine@a"}, ids(inside))

	// The window over (expireDeparted dropped d): the split is in the pool
	// again, ownerless (d is not live).
	after := view(map[string]time.Time{}, 20*time.Second)
	assert.Equal(t, []string{"bounced@", "free@", "mine@a"}, ids(after))

	// Another instance's window does not withhold d's split.
	other := view(map[string]time.Time{"e": now}, 20*time.Second)
	assert.Equal(t, []string{"bounced@", "free@", "mine@a"}, ids(other))

	// NoRebalanceDelay never withholds, even with a departed entry present.
	never := view(map[string]time.Time{"d": now}, NoRebalanceDelay)
	assert.Equal(t, []string{"bounced@", "free@", "mine@a"}, ids(never))

	// The same with the departed map driven by expireDeparted: inside the
	// window the entry stays and the split is held back; at the deadline it
	// goes and the split is released to the pool.
	dep := map[string]time.Time{"d": now}
	require.False(t, expireDeparted(dep, 20*time.Second, now.Add(19*time.Second)))
	assert.NotContains(t, ids(view(dep, 20*time.Second)), "bounced@")
	require.True(t, expireDeparted(dep, 20*time.Second, now.Add(20*time.Second)))
	assert.Contains(t, ids(view(dep, 20*time.Second)), "bounced@")
}

func TestAssignInputWeightsAndOrder(t *testing.T) {
	in := inputOf(leaderView{
		splits: map[string]*splitView{
			"c": lv(statusRunnable, "a", 7, ""),
			"a": lv(statusRunnable, "a", 1, ""),
			"b": lv(statusRunnable, "a", 1<<40, ""),
		},
		presence: present("a"), maxInFlight: 1,
	})
	assert.Equal(t, []assignSplit{{ID: "a", Weight: 1, Owner: "a"}, {ID: "b", Weight: 1 << 40, Owner: "a"}, {ID: "c", Weight: 7, Owner: "a"}}, in.Splits)
}

// assignInput feeds computeAssignment, which is deterministic in its input; the input
// must be deterministic in the view too, or a leader recomputing an
// unchanged view can publish a different assignment. Two live members'
// records can both name one split for a while (a publish whose write to the
// old assignee failed while the write to the new one landed).
func TestAssignInputIsDeterministicWhenTwoLiveRecordsNameOneSplit(t *testing.T) {
	v := leaderView{
		splits:   map[string]*splitView{"s": lv(statusRunnable, "dead", 1, "")},
		presence: present("a", "b"),
		assigns: map[string]assignEntry{
			"a": {val: &assignmentVal{Schema: SchemaVersion, Generation: 1, Splits: []string{"s"}}, rev: 10},
			"b": {val: &assignmentVal{Schema: SchemaVersion, Generation: 2, Splits: []string{"s"}}, rev: 20},
		},
		maxInFlight: 4,
	}
	first := inputOf(v)
	owners := map[string]int{}
	for range 200 {
		in := inputOf(v)
		require.Len(t, in.Splits, 1)
		owners[in.Splits[0].Owner]++
	}
	assert.Len(t, owners, 1, "the in-flight owner of a split named by two live records flips between calls on one view: %v (first call: %q)",
		owners, first.Splits[0].Owner)
}

// A property over random views: a split is in the pool iff it is runnable,
// not completed, has a spec and is not withheld for a departed owner; its
// owner is the live member whose record names it if that is not its holder
// (a move in flight: pinned), else its live holder (lease, then durable
// owner), else none.
func TestAssignInputPoolProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		insts := []string{"a", "b", "c", "d", "e"}
		live := map[string]presenceEntry{}
		for _, i := range insts {
			if rapid.Bool().Draw(t, "live-"+i) {
				live[i] = presenceEntry{rev: 1}
			}
		}
		departed := map[string]time.Time{}
		for _, i := range insts {
			if _, ok := live[i]; !ok && rapid.Bool().Draw(t, "departed-"+i) {
				departed[i] = time.Unix(0, 0)
			}
		}
		delay := rapid.SampledFrom([]time.Duration{NoRebalanceDelay, 20 * time.Second}).Draw(t, "delay")
		ownerGen := rapid.SampledFrom(append([]string{""}, insts...))
		n := rapid.IntRange(0, 12).Draw(t, "splits")
		splits := map[string]*splitView{}
		assigns := map[string]assignEntry{}
		namedBy := map[string]string{}
		for k := range n {
			id := fmt.Sprintf("s%02d", k)
			status := rapid.SampledFrom([]string{statusRunnable, statusRunnable, statusCompleted, statusQuarant}).Draw(t, "status")
			weight := uint64(rapid.IntRange(0, 3).Draw(t, "weight"))
			v := lv(status, ownerGen.Draw(t, "owner"), weight, ownerGen.Draw(t, "lease"))
			v.prog.Completed = status == statusCompleted || rapid.IntRange(0, 9).Draw(t, "completedFlag") == 0
			if rapid.IntRange(0, 9).Draw(t, "noProgress") == 0 {
				v.prog = nil
			}
			splits[id] = v
			if by := ownerGen.Draw(t, "namedBy"); by != "" { // each split named by at most one record
				e := assigns[by]
				if e.val == nil {
					e.val = &assignmentVal{Schema: SchemaVersion, Splits: []string{}}
				}
				e.val.Splits = append(e.val.Splits, id)
				assigns[by] = e
				namedBy[id] = by
			}
		}
		in := inputOf(leaderView{splits: splits, presence: live, assigns: assigns, departed: departed,
			delay: delay, maxInFlight: 3, seed: 7})

		got := map[string]assignSplit{}
		for _, s := range in.Splits {
			got[s.ID] = s
		}
		require.True(t, slices.IsSortedFunc(in.Splits, func(x, y assignSplit) int { return cmpString(x.ID, y.ID) }))
		for id, v := range splits {
			p := v.prog
			_, gone := departed[ownerOf(p)]
			want := p != nil && p.Status == statusRunnable && !p.Completed && v.spec != nil &&
				!(delay != NoRebalanceDelay && p.Owner != nil && gone)
			s, in := got[id]
			require.Equal(t, want, in, "split %s membership", id)
			if !in {
				continue
			}
			require.Equal(t, v.spec.Weight, s.Weight)
			// The holder: the live lease's holder, else the live durable
			// owner (a holder that is not live counts as none). A live
			// member's record naming the split somewhere else is a move in
			// flight: pinned to that destination.
			var owner string
			switch {
			case v.lease != nil:
				owner = v.lease.Owner
			default:
				owner = p.owner()
			}
			if !isLive(live, owner) {
				owner = ""
			}
			pinned := false
			if dest := namedBy[id]; isLive(live, dest) && dest != owner {
				owner, pinned = dest, true
			}
			require.Equal(t, owner, s.Owner, "split %s owner", id)
			require.Equal(t, pinned, s.Pinned, "split %s pinned", id)
		}
	})
}

func ownerOf(p *progressRecord) string {
	if p == nil || p.Owner == nil {
		return "\x00none"
	}
	return *p.Owner
}

func isLive(live map[string]presenceEntry, id string) bool {
	_, ok := live[id]
	return ok
}

// The leader publishes only the records that changed, and a steady state
// writes nothing.
// assignWrites writes only records that differ from the view's (another
// generation or other splits), deletes the records of instances neither
// present nor inside a delay window, and counts the splits that change
// instance, a live member's record outranking a departed one's.
func TestAssignWritesListsOnlyWhatChanges(t *testing.T) {
	v := leaderView{
		presence: present("a", "b", "c"),
		assigns: map[string]assignEntry{
			"a":    assigned(3, "s1", "s2"), // unchanged: no write
			"b":    assigned(2, "s3"),       // same splits, older generation: update
			"gone": assigned(3, "s4", "s5"), // departed, no window: delete
			"wait": assigned(3, "s6"),       // departed inside its window: kept
		},
		departed: map[string]time.Time{"wait": time.Now()},
	}
	// s4 had two records, a departed one and a live one: the live one is
	// its previous assignee.
	v.assigns["c"] = assigned(3, "s4")
	result := map[string][]string{"a": {"s1", "s2"}, "b": {"s3"}, "c": {"s4", "s5", "s6"}}
	writes, moved := v.assignWrites(result, nil, 3)

	byInst := map[string]*assignWrite{}
	for _, w := range writes {
		require.NotContains(t, byInst, w.inst, "one write per instance")
		byInst[w.inst] = w
	}
	require.Len(t, byInst, 3, "writes: %v", byInst)
	assert.NotContains(t, byInst, "a", "a record that did not change is not written")
	assert.NotContains(t, byInst, "wait", "a departed member inside its delay window keeps its record")
	if w := byInst["b"]; assert.NotNil(t, w) {
		assert.Equal(t, uint64(1), w.rev, "an update is fenced on the view's revision")
		assert.Equal(t, uint64(3), w.val.Generation)
		assert.False(t, w.delete)
	}
	if w := byInst["c"]; assert.NotNil(t, w) {
		assert.Equal(t, []string{"s4", "s5", "s6"}, w.val.Splits)
	}
	if w := byInst["gone"]; assert.NotNil(t, w) {
		assert.True(t, w.delete, "an instance neither present nor waiting loses its record")
		assert.Equal(t, uint64(1), w.rev)
	}
	// s5 (gone → c) and s6 (wait → c) moved; s4 stayed with c, whose live
	// record outranks gone's.
	assert.Equal(t, 2, moved)

	// A new instance's record is created (revision 0).
	writes, _ = v.assignWrites(map[string][]string{"a": {"s1", "s2"}, "b": {"s3"}, "c": {"s4"}, "d": {"s5", "s6"}}, nil, 3)
	created := 0
	for _, w := range writes {
		if w.inst == "d" {
			created++
			assert.Zero(t, w.rev, "a record the view does not hold is created")
		}
	}
	assert.Equal(t, 1, created)
}

func TestPublishWritesOnlyChangedRecords(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	a.planning.plan = &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Generation: 3}
	a.leader.term = &leadership{generation: 3}
	a.members.presence = present("me", "peer")
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		v := a.job.view(id)
		v.prog = rec(id, 0, "")
		v.spec = &specRecord{Schema: SchemaVersion, ID: id, Weight: 1, Descriptor: []byte{}}
	}
	a.publish(time.Now())
	settleIO(t, a)
	require.False(t, a.leader.pub.busy)
	require.Len(t, a.assigns.byInst, 2)
	total := 0
	for _, inst := range []string{"me", "peer"} {
		e, ok := st.entry(Durable, prefixAssign+inst)
		require.True(t, ok, "assignment of %s", inst)
		got, err := decodeAssignment(e.Key, e.Value)
		require.NoError(t, err)
		assert.Equal(t, uint64(3), got.Generation)
		assert.Equal(t, a.assigns.byInst[inst].val.Splits, got.Splits)
		total += len(got.Splits)
	}
	assert.Equal(t, 4, total, "every pooled split is assigned once")

	writes := st.count("create", prefixAssign) + st.count("update", prefixAssign)
	a.publish(time.Now())
	settleIO(t, a)
	assert.Equal(t, writes, st.count("create", prefixAssign)+st.count("update", prefixAssign), "a steady state writes nothing")

	// A member leaves for good (no delay window): its record is deleted and
	// its splits go to the remaining member.
	delete(a.members.presence, "peer")
	a.publish(time.Now())
	settleIO(t, a)
	_, ok := st.entry(Durable, prefixAssign+"peer")
	assert.False(t, ok, "the record of an instance neither present nor inside a delay window is deleted")
	assert.Len(t, a.assigns.byInst["me"].val.Splits, 4)
}

// A publish whose update of a member's record lost its compare-and-swap
// (another writer — a deposed leader's late write — moved the record) must
// not forget the newer record the watch folded meanwhile: forgetting it
// makes every later publish try to create a record that exists, lose, mark
// the view dirty and publish again, until a reconcile listing restores it.
func TestPublishKeepsARecordFoldedWhileItsLosingWriteWasInFlight(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	a.planning.plan = &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Generation: 3}
	a.leader.term = &leadership{generation: 3}
	a.members.presence = present("me", "peer")
	for _, id := range []string{"s1", "s2"} {
		v := a.job.view(id)
		v.prog = rec(id, 0, "")
		v.spec = &specRecord{Schema: SchemaVersion, ID: id, Weight: 1, Descriptor: []byte{}}
	}
	old := &assignmentVal{Schema: SchemaVersion, Generation: 2, Splits: []string{}}
	for _, inst := range []string{"me", "peer"} {
		a.setAssign(inst, old, st.put(Durable, prefixAssign+inst, encode(old)))
	}
	late := &assignmentVal{Schema: SchemaVersion, Generation: 2, Splits: []string{"s1", "s2"}}
	var lateRev uint64
	st.setFault(func(c fakeCall) fakeFault {
		if c.op == "update" && c.key == prefixAssign+"peer" && lateRev == 0 {
			lateRev = st.put(Durable, prefixAssign+"peer", encode(late)) // lands just before our update
		}
		return fakeFault{}
	})
	a.publish(time.Now())
	a.io.wg.Wait()
	require.NotZero(t, lateRev)
	require.NoError(t, a.durablePut(prefixAssign+"peer", encode(late), lateRev, live)) // the watch delivers it
	require.Equal(t, lateRev, a.assigns.byInst["peer"].rev)
	require.NoError(t, a.io.runResults()) // publishDone

	e, ok := a.assigns.byInst["peer"]
	assert.True(t, ok && e.rev == lateRev, "the record folded at revision %d was forgotten by the lost write's answer: %+v", lateRev, e)

	a.publish(time.Now())
	settleIO(t, a)
	assert.Zero(t, st.count("create", prefixAssign+"peer"), "the next publish must update the existing record, not try to create it")
}

// inputOf is the assignment input alone.
func inputOf(v leaderView) assignIn {
	in, _ := assignInput(v)
	return in
}

// The leader moves held splits only when the fleet changed since its last
// balanced publish: a fleet whose loads shift as splits complete keeps
// every held split where it is, and a join balances again.
func TestPublishMovesHeldSplitsOnlyWhenTheFleetChanges(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	a.planning.plan = &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Generation: 3}
	a.leader.term = &leadership{generation: 3}
	a.members.presence = present("me", "peer")
	hold := map[string]string{"s1": "me", "s2": "me", "s3": "me", "s4": "peer", "s5": "peer", "s6": "peer"}
	for id, o := range hold {
		v := a.job.view(id)
		v.prog = rec(id, 1, o)
		v.spec = &specRecord{Schema: SchemaVersion, ID: id, Weight: 1, Descriptor: []byte{}}
	}
	publish := func() map[string][]string {
		a.publish(time.Now())
		settleIO(t, a)
		out := map[string][]string{}
		for inst, e := range a.assigns.byInst {
			out[inst] = e.val.Splits
		}
		return out
	}
	require.Equal(t, map[string][]string{"me": {"s1", "s2", "s3"}, "peer": {"s4", "s5", "s6"}}, publish())

	// peer's splits complete: me holds 3, peer nothing. Unsteady, one of
	// me's would move (gap 3); steady, none does.
	for _, id := range []string{"s4", "s5", "s6"} {
		a.job.splits[id].prog.Completed = true
	}
	require.Equal(t, map[string][]string{"me": {"s1", "s2", "s3"}, "peer": {}}, publish(), "no held split moves in a steady fleet")

	// A member joins (proven): the fleet changed, so the improve pass runs.
	a.members.presence["third"] = presenceEntry{rev: 9}
	got := publish()
	assert.Len(t, got["me"], 1, "a join balances the held splits again: %v", got)
}
