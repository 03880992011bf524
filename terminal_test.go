package spate

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func listing(statuses ...string) []*progressRecord {
	out := make([]*progressRecord, len(statuses))
	for i, s := range statuses {
		r := rec("s", 1, "")
		r.Status = s
		r.Completed = s == statusCompleted
		out[i] = r
	}
	return out
}

func TestJudgeTerminal(t *testing.T) {
	const c, q, r = statusCompleted, statusQuarant, statusRunnable
	cases := []struct {
		name          string
		final         bool
		planned       uint64
		known         int
		listed        []*progressRecord
		want          verdict
		wantCompleted int
		wantQuarant   int
	}{
		{"not final", false, 2, 2, listing(c, c), verdictNone, 2, 0},
		{"fewer listed than planned", true, 3, 2, listing(c, c), verdictNone, 2, 0},
		{"listing misses a split the view knows", true, 2, 3, listing(c, c), verdictNone, 2, 0},
		{"all complete", true, 2, 2, listing(c, c), verdictAllComplete, 2, 0},
		{"all complete, more listed than planned or known", true, 1, 1, listing(c, c, c), verdictAllComplete, 3, 0},
		{"stalled: the rest quarantined", true, 3, 3, listing(c, q, c), verdictStalled, 2, 1},
		{"stalled: everything quarantined", true, 2, 2, listing(q, q), verdictStalled, 0, 2},
		{"a runnable split among completed", true, 3, 3, listing(c, r, c), verdictNone, 2, 0},
		{"a runnable split among completed and quarantined", true, 3, 3, listing(c, q, r), verdictNone, 1, 1},
		{"an empty final plan with nothing planned", true, 0, 0, nil, verdictAllComplete, 0, 0},
		{"stalled needs the counts too: not final", false, 2, 2, listing(c, q), verdictNone, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, completed, quarantined := judgeTerminal(tc.final, tc.planned, tc.known, tc.listed, nil)
			assert.Equal(t, tc.want, v)
			assert.Equal(t, tc.wantCompleted, completed)
			assert.Equal(t, tc.wantQuarant, quarantined)
		})
	}
}

// A divided split's child that the listing lacks (the leader has not
// created it yet) holds the verdict back, even with every listed split
// completed; once it is listed, or damaged, the verdict follows.
func TestJudgeTerminalWaitsForChildren(t *testing.T) {
	parent := rec("p", 1, "")
	parent.Status, parent.Completed = statusCompleted, true
	parent.Children = []childSplit{{ID: "p_d5", Position: 5, Weight: 1, Descriptor: []byte{}}}
	v, _, _ := judgeTerminal(true, 1, 1, []*progressRecord{parent}, nil)
	assert.Equal(t, verdictNone, v, "a child not created yet must hold the verdict back")
	child := rec("p_d5", 0, "")
	child.Status, child.Completed = statusCompleted, true
	v, _, _ = judgeTerminal(true, 1, 1, []*progressRecord{parent, child}, nil)
	assert.Equal(t, verdictAllComplete, v)
	v, _, _ = judgeTerminal(true, 1, 1, []*progressRecord{parent}, []string{"p_d5"})
	assert.Equal(t, verdictStalled, v, "a damaged child is out of play: the job stalls")
}

// AllComplete iff final && n >= planned && n >= known && every listed split
// completed; Stalled iff the same gates hold and every listed split is
// completed or quarantined with at least one quarantined.
func TestJudgeTerminalProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		final := rapid.Bool().Draw(t, "final")
		planned := rapid.Uint64Range(0, 8).Draw(t, "planned")
		known := rapid.IntRange(0, 8).Draw(t, "known")
		statuses := rapid.SliceOfN(rapid.SampledFrom([]string{statusCompleted, statusCompleted, statusQuarant, statusRunnable}), 0, 8).Draw(t, "statuses")
		listed := listing(statuses...)
		damaged := rapid.IntRange(0, 2).Draw(t, "damaged")
		v, completed, quarantined := judgeTerminal(final, planned, known, listed, make([]string, damaged))

		n := len(listed) + damaged
		wantC, wantQ := 0, 0
		for _, s := range statuses {
			switch s {
			case statusCompleted:
				wantC++
			case statusQuarant:
				wantQ++
			}
		}
		require.Equal(t, wantC, completed)
		require.Equal(t, wantQ, quarantined)
		gates := final && uint64(n) >= planned && n >= known
		allCompleted := wantC == n
		require.Equal(t, gates && allCompleted, v == verdictAllComplete, "AllComplete")
		require.Equal(t, gates && !allCompleted && wantC+wantQ+damaged == n, v == verdictStalled, "Stalled")
		if !gates {
			require.Equal(t, verdictNone, v)
		}
	})
}

// ----- detectTerminal on the loop --------------------------------------------------

// completeView is an actor whose view says the job is over: a final plan of
// n splits, each completed, with the same records in the store.
func completeView(t *testing.T, n int) (*actor, *fakeStore) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	a.planning.plan = &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: uint64(n)}
	for i := range n {
		id := string(rune('a' + i))
		r := rec(id, 1, "")
		r.Status, r.Completed, r.Watermark = statusCompleted, true, wm(1)
		a.upsert(id, r, st.put(Durable, prefixSplit+id, encode(r)), live)
	}
	return a, st
}

func TestDetectTerminalLatchesAllCompleteOnAListing(t *testing.T) {
	a, st := completeView(t, 3)
	a.detectTerminal()
	settleIO(t, a)
	assert.True(t, a.verdicts.terminal)
	assert.Equal(t, []Event{AllComplete{}}, events(t, a))
	assert.Equal(t, 1, st.count("list", prefixSplit))
	a.verdicts.terminal = false // a second check with nothing changed lists nothing
	a.detectTerminal()
	settleIO(t, a)
	assert.Equal(t, 1, st.count("list", prefixSplit), "nothing changed since the last authoritative check")
}

// A record the view holds but the listing lacks was deleted: no verdict,
// however complete the view looks.
func TestDetectTerminalNoVerdictWhenTheListingLacksAKnownSplit(t *testing.T) {
	a, st := completeView(t, 3)
	a.planning.plan.Planned = 2
	st.remove(Durable, prefixSplit+"b")
	a.detectTerminal()
	settleIO(t, a)
	assert.False(t, a.verdicts.terminal)
	assert.Empty(t, events(t, a))
}

// A listing that shows a split the watch has not delivered yet, still
// runnable, holds the verdict back.
func TestDetectTerminalNoVerdictOnARunnableSplitOnlyTheListingShows(t *testing.T) {
	a, st := completeView(t, 2)
	st.put(Durable, prefixSplit+"z", encode(rec("z", 0, "")))
	a.detectTerminal()
	settleIO(t, a)
	assert.False(t, a.verdicts.terminal)
	assert.Empty(t, events(t, a))
	assert.Equal(t, 3, a.job.nSplits, "the listing folded the split into the view")
}

func TestDetectTerminalStalled(t *testing.T) {
	a, st := completeView(t, 2)
	q := rec("q", 4, "")
	q.Status, q.Attempts = statusQuarant, 4
	a.upsert("q", q, st.put(Durable, prefixSplit+"q", encode(q)), live)
	a.planning.plan.Planned = 3
	a.detectTerminal()
	settleIO(t, a)
	assert.True(t, a.verdicts.terminal)
	assert.Equal(t, []Event{Stalled{Completed: 2, Quarantined: 1}}, events(t, a))
}

func TestDetectTerminalGates(t *testing.T) {
	a, st := completeView(t, 2)
	a.planning.plan.Finality = finalityOpen
	a.detectTerminal()
	a.planning.plan.Finality = finalityFinal
	a.planning.plan.Planned = 3
	a.detectTerminal()
	a.planning.plan.Planned = 2
	a.upsert("r", rec("r", 0, ""), st.put(Durable, prefixSplit+"r", encode(rec("r", 0, ""))), live)
	a.detectTerminal()
	settleIO(t, a)
	assert.Zero(t, st.count("list", ""), "an open plan, a short count or a runnable split in the view lists nothing")

	// A failed listing is retried later, not judged.
	b, st2 := completeView(t, 1)
	st2.setFault(func(c fakeCall) fakeFault {
		if c.op == "list" {
			return fakeFault{err: Retryablef("down")}
		}
		return fakeFault{}
	})
	b.detectTerminal()
	settleIO(t, b)
	assert.False(t, b.verdicts.terminal)
	assert.Zero(t, b.verdicts.listedAt, "a failed check leaves no record of having checked")
	assert.Contains(t, b.io.retry, opKey{op: "terminal"})
}

// A verdict write that fails because the coordinator is closing (its
// context cancelled) is no warning: 6 of 21 clean exits logged "writing
// the verdict record failed ... context canceled". A failure while the
// coordinator runs is still a warning, retried.
func TestAVerdictWriteCutByCloseIsNoWarning(t *testing.T) {
	for _, closing := range []bool{false, true} {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		var logs bytes.Buffer
		a.log = slog.New(slog.NewTextHandler(&logs, nil))
		a.kw = stubKeyWatcher{} // a scoped fleet: the leader records its verdict
		a.leader.term = &leadership{generation: 1}
		a.w.fullView = true
		a.verdicts.judged = &verdictVal{Schema: SchemaVersion, FP: testFPHash, Verdict: "complete", Completed: 1}
		st.fault = func(fakeCall) fakeFault { return fakeFault{err: Retryablef("fake: context canceled")} }
		a.syncVerdict(time.Now())
		if closing {
			a.io.stopping = true
		}
		settleIO(t, a)
		if closing {
			assert.NotContains(t, logs.String(), "level=WARN", "a write cut by the close is no warning")
		} else {
			assert.Contains(t, logs.String(), "writing the verdict record failed; retrying")
		}
	}
}

type stubKeyWatcher struct{}

func (stubKeyWatcher) WatchKeys(context.Context, Keyspace, []string) (<-chan WatchEvent, error) {
	return nil, Fatalf("stub")
}

// A scoped worker may read the leader's verdict before the plan record
// (two watches): PlanFinalized still comes first, once. Seen in CI as a
// late joiner that heard AllComplete and never PlanFinalized.
func TestAVerdictReadBeforeThePlanFinalizesItFirst(t *testing.T) {
	for _, v := range []*verdictVal{
		{Schema: SchemaVersion, FP: testFPHash, Verdict: verdictKeyComplete, Completed: 3},
		{Schema: SchemaVersion, FP: testFPHash, Verdict: verdictKeyStalled, Completed: 2, Quarantined: 1},
	} {
		a := newTestActor(t, newFakeStore(), testConfig())
		a.kw = stubKeyWatcher{} // scoped: it acts on the leader's verdict
		a.onVerdict(v)
		got := events(t, a)
		require.Len(t, got, 2, "%v", got)
		assert.Equal(t, PlanFinalized{Planned: 3}, got[0], "the verdict implies the final plan: it is told first")
		a.setPlan(&planRecord{Schema: SchemaVersion, Finality: finalityFinal, Planned: 3}, 9)
		assert.Empty(t, events(t, a), "the plan read later finalizes nothing again")
	}
}
