package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/stretchr/testify/require"
)

// fakeCoord is a hand-written SplitCoordinator: Poll hands out queued
// events, and every call is recorded. commitErr decides commit outcomes.
type fakeCoord struct {
	mu             sync.Mutex
	waker          spate.Waker
	started        bool
	queue          []spate.Event
	pollErr        error
	commits        map[string][]spate.SplitProgress
	commitErr      func(split spate.SplitID, p spate.SplitProgress) error
	commitGate     func(split spate.SplitID) error // called before the lock
	failErr        func(split spate.SplitID) error
	fails          []string
	failReasons    []string
	releases       [][]spate.SplitID
	releaseDrained []spate.SplitID
	declines       []spate.SplitID
}

func newFakeCoord() *fakeCoord { return &fakeCoord{commits: map[string][]spate.SplitProgress{}} }

func (c *fakeCoord) SetWaker(w spate.Waker)         { c.waker = w }
func (c *fakeCoord) Start(spate.SplitPlanner) error { c.started = true; return nil }
func (c *fakeCoord) Close() error                   { return nil }

func (c *fakeCoord) push(evs ...spate.Event) {
	c.mu.Lock()
	c.queue = append(c.queue, evs...)
	c.mu.Unlock()
	c.waker.Wake()
}

func (c *fakeCoord) Poll() ([]spate.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs := c.queue
	c.queue = nil
	return evs, c.pollErr
}

func (c *fakeCoord) CommitAt(_ context.Context, s spate.SplitID, _ spate.LeaseEpoch, p spate.SplitProgress) error {
	if c.commitGate != nil {
		if err := c.commitGate(s); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.commitErr != nil {
		if err := c.commitErr(s, p); err != nil {
			return err
		}
	}
	c.commits[s.String()] = append(c.commits[s.String()], p)
	return nil
}

func (c *fakeCoord) Fail(_ context.Context, s spate.SplitID, reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fails = append(c.fails, s.String())
	c.failReasons = append(c.failReasons, reason)
	if c.failErr != nil {
		return c.failErr(s)
	}
	return nil
}

func (c *fakeCoord) Release(_ context.Context, s ...spate.SplitID) error {
	c.releases = append(c.releases, s)
	return nil
}

func (c *fakeCoord) ReleaseDrained(_ context.Context, s ...spate.SplitID) error {
	c.releaseDrained = append(c.releaseDrained, s...)
	return nil
}

func (c *fakeCoord) DeclineRevoke(_ context.Context, s spate.SplitID) error {
	c.declines = append(c.declines, s)
	return nil
}

func (c *fakeCoord) Depart(context.Context) error { return nil }

// nopLane emits its records (offsets from, from+1, ...) in one batch on
// its first poll, then nothing. polls counts the polls that reached it.
type nopLane struct {
	id      pipeline.LaneID
	part    pipeline.PartitionID
	issuer  *pipeline.AckIssuer
	from    int64
	records int
	polls   *int
}

func (l *nopLane) ID() pipeline.LaneID             { return l.id }
func (l *nopLane) Partition() pipeline.PartitionID { return l.part }
func (l *nopLane) Poll(int, time.Duration) (*pipeline.Batch, error) {
	*l.polls++
	if l.records == 0 {
		return nil, nil
	}
	b := &pipeline.Batch{}
	for i := range l.records {
		b.Payloads = append(b.Payloads, pipeline.RawPayload{Value: []byte("r"), Partition: l.part, Offset: l.from + int64(i)})
	}
	b.Ack = l.issuer.Issue(l.part, l.from+int64(l.records)-1)
	l.from += int64(l.records)
	l.records = 0
	return b, nil
}

// fakeSplits is a SplitSource that records its calls.
type fakeSplits struct {
	opens        []pipeline.SplitOpening
	failOpen     func(spate.SplitID) error
	closed       []string
	completeAt   map[string]int64
	sweep        map[string]*spate.SplitProgress
	finishing    []spate.SplitID
	declineDrain bool
	begun        []string
	validate     func(spate.SplitSpec, spate.SplitProgress) error
	encoded      []int64
	emit         map[string]int // records a split's lane emits on its first poll
	polls        map[string]*int
}

func newFakeSplits() *fakeSplits {
	return &fakeSplits{completeAt: map[string]int64{}, sweep: map[string]*spate.SplitProgress{}, emit: map[string]int{}, polls: map[string]*int{}}
}

func (f *fakeSplits) OpenSplit(o pipeline.SplitOpening) (pipeline.Lane, error) {
	if f.failOpen != nil {
		if err := f.failOpen(o.Spec.ID); err != nil {
			return nil, err
		}
	}
	f.opens = append(f.opens, o)
	var from int64
	if o.Progress != nil {
		from = o.Progress.Watermark
	}
	n := new(int)
	f.polls[o.Spec.ID.String()] = n
	return &nopLane{id: o.Lane, part: o.Partition, issuer: o.Issuer, from: from, records: f.emit[o.Spec.ID.String()], polls: n}, nil
}

func (f *fakeSplits) ValidateResume(s spate.SplitSpec, p spate.SplitProgress) error {
	if f.validate != nil {
		return f.validate(s, p)
	}
	return nil
}

func (f *fakeSplits) EncodeCommit(s spate.SplitID, w int64) (spate.SplitProgress, error) {
	f.encoded = append(f.encoded, w)
	if at, ok := f.completeAt[s.String()]; ok && w >= at {
		return spate.CompletedProgress(w, nil), nil
	}
	return spate.NewSplitProgress(w, nil), nil
}

func (f *fakeSplits) Sweep(s spate.SplitID) (*spate.SplitProgress, error) {
	return f.sweep[s.String()], nil
}
func (f *fakeSplits) CloseSplit(s spate.SplitID) { f.closed = append(f.closed, s.String()) }
func (f *fakeSplits) TakeFinishing() []spate.SplitID {
	out := f.finishing
	f.finishing = nil
	return out
}
func (f *fakeSplits) BeginRevoke(s spate.SplitID) bool {
	f.begun = append(f.begun, s.String())
	return !f.declineDrain
}

func sid(s string) spate.SplitID { return spate.MustSplitID(s) }

func gained(s string, epoch uint64) spate.Gained {
	return spate.Gained{Split: spate.NewSplitSpec(sid(s), []byte(s)), Epoch: spate.LeaseEpoch(epoch)}
}

type driverFixture struct {
	t     *testing.T
	coord *fakeCoord
	src   *fakeSplits
	d     *pipeline.CoordinationDriver[*fakeCoord]
}

func newDriverFixture(t *testing.T, opts ...pipeline.DriverOption) *driverFixture {
	f := &driverFixture{t: t, coord: newFakeCoord(), src: newFakeSplits()}
	f.d = pipeline.NewCoordinationDriver(f.coord, opts...)
	cp := pipeline.NewCheckpointer(nil)
	f.d.Open(pipeline.SourceCtx{Issuer: cp.Issuer()})
	ev, err := f.d.Start(nil)
	require.NoError(t, err, "start")
	require.Equal(t, pipeline.LanesAssigned, ev.Kind, "start: want the empty ready assignment")
	require.Empty(t, ev.Lanes, "start: want the empty ready assignment")
	return f
}

func (f *driverFixture) poll() pipeline.SourceEvent {
	f.t.Helper()
	ev, err := f.d.PollEvents(f.src, 0)
	require.NoError(f.t, err, "poll")
	return ev
}

func (f *driverFixture) expect(kind pipeline.EventKind) pipeline.SourceEvent {
	f.t.Helper()
	ev := f.poll()
	require.Equal(f.t, kind, ev.Kind, "event")
	return ev
}

func (f *driverFixture) partitionOf(split string) pipeline.PartitionID {
	for _, a := range f.d.Assignments() {
		if a.Split.String() == split {
			return a.Partition
		}
	}
	require.FailNow(f.t, "split not held", "split %s", split)
	return 0
}

// 53
func TestDriverWakerCutsTheParkShort(t *testing.T) {
	f := newDriverFixture(t)
	start := time.Now()
	ev, _ := f.d.PollEvents(f.src, 50*time.Millisecond)
	require.Equal(t, pipeline.Idle, ev.Kind, "with nothing signalled the park ends Idle")
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "with nothing signalled the park must last its timeout")
	go func() { f.coord.push(gained("a", 1)) }()
	ev, err := f.d.PollEvents(f.src, time.Minute)
	require.NoError(t, err)
	// The wake ended the park (Idle); the gain is picked up next.
	require.Contains(t, []pipeline.EventKind{pipeline.Idle, pipeline.LanesAdded}, ev.Kind, "event")
	if ev.Kind == pipeline.Idle {
		f.expect(pipeline.LanesAdded)
	}
}

// 54
func TestDriverFailedOpenUndoesTheWholeBatch(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1), gained("b", 1))
	failed := false
	f.src.failOpen = func(s spate.SplitID) error {
		if s.String() == "b" && !failed {
			failed = true
			return errors.New("cannot open")
		}
		return nil
	}
	_, err := f.d.PollEvents(f.src, 0)
	require.Error(t, err, "a failed open must surface")
	require.Equal(t, []string{"a"}, f.src.closed, "the lanes built so far must be dropped")
	ev := f.expect(pipeline.LanesAdded)
	require.Len(t, ev.Lanes, 2, "the retry opens both lanes")
	for _, l := range ev.Lanes {
		require.GreaterOrEqual(t, l.ID(), pipeline.LaneID(2), "lane id reused: ids of a failed batch are burned")
	}
}

// 55
func TestDriverGainsCoalesceAndLeaveLiveLanesAlone(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1), gained("b", 1))
	require.Len(t, f.expect(pipeline.LanesAdded).Lanes, 2, "gains must coalesce into one LanesAdded")
	pa := f.partitionOf("a")
	f.coord.push(gained("c", 1))
	require.Len(t, f.expect(pipeline.LanesAdded).Lanes, 1, "a mid-flow gain adds only its own lane")
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 7}}))
	got := f.coord.commits["a"]
	require.Len(t, got, 1, "commits of a: %v", got)
	require.EqualValues(t, 7, got[0].Watermark, "commits of a: %v", got)
}

// 56
func TestDriverFinishingSurfacesAsCommitReadyOnce(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	f.src.finishing = []spate.SplitID{sid("a"), sid("zz")}
	ev := f.expect(pipeline.CommitReady)
	require.Equal(t, []pipeline.PartitionID{f.partitionOf("a")}, ev.Partitions, "an unheld split finishing is not reported")
	f.expect(pipeline.Idle)
}

// 57
func TestDriverLossRevokesOnlyTheLostLane(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1), gained("b", 1))
	added := f.expect(pipeline.LanesAdded)
	pa := f.partitionOf("a")
	f.coord.push(spate.Lost{Split: sid("a")})
	ev := f.expect(pipeline.LanesRevoked)
	require.Equal(t, []pipeline.LaneID{added.Lanes[0].ID()}, ev.LaneIDs, "only the lost split's lane is revoked")
	require.Equal(t, 1, ev.Barrier.Remaining())
	require.Equal(t, []string{"a"}, f.src.closed)
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 9}}))
	require.Empty(t, f.coord.commits["a"], "a late drain commit after the loss must be skipped")
}

// ★58
func TestDriverFencedCommitRetiresTheTenancy(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	first := f.expect(pipeline.LanesAdded)
	pa := f.partitionOf("a")
	f.coord.commitErr = func(spate.SplitID, spate.SplitProgress) error { return spate.Fencedf("lost the CAS") }
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}), "a fenced commit is handled, not returned")
	ev := f.expect(pipeline.LanesRevoked)
	require.Equal(t, first.Lanes[0].ID(), ev.LaneIDs[0], "the fenced tenancy's lane must be revoked")
	f.coord.commitErr = nil
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 6}}))
	require.Empty(t, f.coord.commits["a"], "late watermarks of a fenced tenancy must be skipped")
	f.coord.push(spate.Lost{Split: sid("a")})
	f.expect(pipeline.Idle) // the following Lost is a no-op
	f.coord.push(gained("a", 2))
	again := f.expect(pipeline.LanesAdded)
	require.NotEqual(t, first.Lanes[0].ID(), again.Lanes[0].ID(), "a re-gain must be a fresh tenancy: a new lane")
	require.NotEqual(t, pa, again.Lanes[0].Partition(), "a re-gain must be a fresh tenancy: a new partition")
}

// 59
func TestDriverLostAndRegainedInOneBatchSwapsCleanly(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	first := f.expect(pipeline.LanesAdded)
	f.coord.push(spate.Lost{Split: sid("a")}, gained("a", 2))
	rev := f.expect(pipeline.LanesRevoked)
	add := f.expect(pipeline.LanesAdded)
	require.Equal(t, first.Lanes[0].ID(), rev.LaneIDs[0], "the old tenancy's lane is revoked")
	require.NotEqual(t, first.Lanes[0].Partition(), add.Lanes[0].Partition(), "the new tenancy has a partition of its own")
	require.EqualValues(t, 2, f.src.opens[1].Epoch, "the new tenancy carries the new epoch")
}

// 60
func TestDriverRetryableCommitDefers(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	pa := f.partitionOf("a")
	f.coord.commitErr = func(spate.SplitID, spate.SplitProgress) error { return spate.Retryablef("store slow") }
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}), "a retryable commit is deferred, not returned")
	// The controller learns which partitions were deferred, so it retries
	// them and does not count them committed.
	parts, err := f.d.TakeDeferred()
	require.Equal(t, []pipeline.PartitionID{pa}, parts, "deferred")
	require.ErrorContains(t, err, "store slow")
	parts, err = f.d.TakeDeferred()
	require.Empty(t, parts, "taken twice")
	require.NoError(t, err, "taken twice")
	f.coord.commitErr = nil
	f.expect(pipeline.Idle)
	require.Empty(t, f.coord.commits["a"], "nothing is re-sent on a bare poll")
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 9}}))
	got := f.coord.commits["a"]
	require.Len(t, got, 1, "the next commit carries merged progress: %v", got)
	require.EqualValues(t, 9, got[0].Watermark, "the next commit carries merged progress: %v", got)
	parts, _ = f.d.TakeDeferred()
	require.Empty(t, parts, "a landed commit is not deferred")
}

// 61
func TestDriverSweepCompletesAndRetiresBarrierless(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	add := f.expect(pipeline.LanesAdded)
	done := spate.CompletedProgress(0, nil)
	f.src.sweep["a"] = &done
	ev := f.expect(pipeline.LanesRetired)
	require.Equal(t, add.Lanes[0].ID(), ev.LaneIDs[0], "the completed lane must retire")
	got := f.coord.commits["a"]
	require.Len(t, got, 1, "terminal progress committed once: %v", got)
	require.True(t, got[0].Completed, "terminal progress committed: %v", got)
}

// 62
func TestDriverTerminalStates(t *testing.T) {
	t.Run("a zero-split standby drains on AllComplete", func(t *testing.T) {
		f := newDriverFixture(t)
		f.coord.push(spate.AllComplete{})
		f.expect(pipeline.Drained)
		f.expect(pipeline.Drained) // idempotent
	})
	t.Run("Stalled is fatal by default", func(t *testing.T) {
		f := newDriverFixture(t)
		f.coord.push(spate.Stalled{Completed: 3, Quarantined: 1})
		_, err := f.d.PollEvents(f.src, 0)
		require.True(t, spate.IsFatal(err), "err %v, want Fatal", err)
	})
	t.Run("a Stalled job with damaged records names them, not quarantine", func(t *testing.T) {
		f := newDriverFixture(t)
		f.coord.push(spate.Stalled{Completed: 3, Damaged: []string{"d1"}})
		_, err := f.d.PollEvents(f.src, 0)
		require.True(t, spate.IsFatal(err), "err %v, want Fatal", err)
		require.ErrorContains(t, err, "1 out of play because a record is damaged (d1", "the error names the damaged split")
	})
	t.Run("Stalled drains when configured", func(t *testing.T) {
		f := newDriverFixture(t, pipeline.StallDrains(true))
		f.coord.push(spate.Stalled{Completed: 3, Quarantined: 1})
		f.expect(pipeline.Drained)
	})
}

// 63
func TestDriverFailReportsPoisonAndRetires(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	require.NoError(t, f.d.Fail(f.src, sid("a"), "bad input"))
	require.Equal(t, []string{"a"}, f.coord.fails)
	f.expect(pipeline.LanesRevoked)
	require.NoError(t, f.d.Fail(f.src, sid("zz"), "x"))
	require.Len(t, f.coord.fails, 1, "failing an unheld split is a no-op")
}

// 63b: poison reported by a lane through its opening.
func TestDriverLanePoisonReport(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	f.src.opens[0].Poison("corrupt line")
	f.expect(pipeline.LanesRevoked)
	require.Equal(t, []string{"a"}, f.coord.fails)
}

// 64
func TestDriverReleaseHandsBackEverything(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1), gained("b", 1))
	f.expect(pipeline.LanesAdded)
	require.NoError(t, f.d.Release(context.Background(), f.src))
	require.Len(t, f.coord.releases, 1, "one release call: %v", f.coord.releases)
	require.Len(t, f.coord.releases[0], 2, "it hands back both splits: %v", f.coord.releases)
}

// 64b: a split the coordinator gained after the coordination driver's last poll (a
// stop while the first claims land) is handed back too: the coordinator
// renews its lease until it closes, so left out it would be out of the
// peers' reach all that time.
func TestDriverReleaseHandsBackUnpolledGains(t *testing.T) {
	f := newDriverFixture(t)
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	f.coord.push(gained("b", 1), gained("c", 2))
	require.NoError(t, f.d.Release(context.Background(), f.src))
	require.Len(t, f.coord.releases, 1, "one release call: %v", f.coord.releases)
	require.ElementsMatch(t, []spate.SplitID{sid("a"), sid("b"), sid("c")}, f.coord.releases[0])

	// Coordination drivers that stage their output: one that polled nothing, one that
	// holds a split of its own.
	g := newDriverFixture(t)
	require.NoError(t, g.d.StageOutput(&fakeStaging{}))
	g.coord.push(gained("x", 1), gained("y", 1))
	require.NoError(t, g.d.Release(context.Background(), g.src))
	require.Len(t, g.coord.releases, 1, "one release call: %v", g.coord.releases)
	require.ElementsMatch(t, []spate.SplitID{sid("x"), sid("y")}, g.coord.releases[0])

	h := newDriverFixture(t)
	require.NoError(t, h.d.StageOutput(&fakeStaging{}))
	h.coord.push(gained("x", 1))
	h.expect(pipeline.LanesAdded)
	h.coord.push(gained("y", 1))
	require.NoError(t, h.d.Release(context.Background(), h.src))
	require.Len(t, h.coord.releases, 1, "one release call: %v", h.coord.releases)
	require.ElementsMatch(t, []spate.SplitID{sid("x"), sid("y")}, h.coord.releases[0])
}

// 65
func TestDriverResumeValidation(t *testing.T) {
	f := newDriverFixture(t)
	drift := errors.New("drifted")
	f.src.validate = func(s spate.SplitSpec, p spate.SplitProgress) error {
		if s.ID.String() == "a" {
			return spate.Retryablef("a: %w", drift)
		}
		if s.ID.String() == "c" {
			return spate.Fatalf("c is corrupt")
		}
		return nil
	}
	refusals := 2
	f.coord.failErr = func(spate.SplitID) error {
		if refusals > 0 {
			refusals--
			return spate.Retryablef("store down")
		}
		return nil
	}
	p := spate.NewSplitProgress(5, nil)
	ga, gb, gc := gained("a", 1), gained("b", 1), gained("c", 1)
	ga.Progress, gb.Progress, gc.Progress = &p, &p, &p
	f.coord.push(ga, gb, gc)
	_, err := f.d.PollEvents(f.src, 0)
	require.True(t, spate.IsFatal(err), "err %v: a Fatal rejection must not hide behind a retryable one", err)
	ev := f.expect(pipeline.LanesAdded)
	require.Len(t, ev.Lanes, 1, "the rest of the batch must still apply")
	require.Equal(t, "b", f.src.opens[0].Spec.ID.String(), "the rest of the batch must still apply")
	require.EqualValues(t, 5, f.src.opens[0].Progress.Watermark, "the rest of the batch resumes from its progress")
	for range 3 {
		f.poll()
	}
	landed := 0
	for _, s := range f.coord.fails {
		if s == "a" || s == "c" {
			landed++
		}
	}
	require.GreaterOrEqual(t, landed, 3, "fails %v: a refused poison report is retried until it lands", f.coord.fails)
	require.Zero(t, refusals, "fails %v: a refused poison report is retried until it lands", f.coord.fails)
	n := len(f.coord.fails)
	f.poll()
	require.Len(t, f.coord.fails, n, "a landed poison report must not be re-sent")
}

// 66
// A revocation drains: the lane is not polled again, the coordination
// driver waits for every emitted record to be acknowledged, commits that
// watermark and hands the split back (or completes it, if that commit
// completes it).
func TestDriverDrainingTenancies(t *testing.T) {
	// a's lane emits records 0..4 (watermark 5) before the revocation.
	setup := func(t *testing.T) (*driverFixture, pipeline.PartitionID, pipeline.Lane) {
		f := newDriverFixture(t)
		f.src.emit["a"] = 5
		f.coord.push(gained("a", 1), gained("b", 1))
		add := f.expect(pipeline.LanesAdded)
		lane := add.Lanes[0]
		b, err := lane.Poll(100, 0)
		require.NoError(t, err)
		require.Len(t, b.Payloads, 5)
		b.Ack.Release()
		f.coord.push(spate.RevokeRequested{Split: sid("a")})
		ev := f.expect(pipeline.CommitReady)
		require.Equal(t, []pipeline.PartitionID{f.partitionOf("a")}, ev.Partitions, "a drain is chased, not left to the commit tick")
		return f, f.partitionOf("a"), lane
	}
	watermarks := func(ps []spate.SplitProgress) []int64 {
		var out []int64
		for _, p := range ps {
			out = append(out, p.Watermark)
		}
		return out
	}
	t.Run("the lane is not polled once draining", func(t *testing.T) {
		f, _, lane := setup(t)
		polls := *f.src.polls["a"]
		b, err := lane.Poll(100, 0)
		require.NoError(t, err)
		require.Nil(t, b)
		require.Equal(t, polls, *f.src.polls["a"], "the source's lane was polled after the drain began")
	})
	t.Run("hands back only once everything emitted is acknowledged", func(t *testing.T) {
		f, pa, lane := setup(t)
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 3}}))
		f.expect(pipeline.Idle)
		require.Empty(t, f.coord.releaseDrained, "records 3 and 4 are not acknowledged yet")
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
		ev := f.expect(pipeline.LanesRetired)
		require.Equal(t, []pipeline.LaneID{lane.ID()}, ev.LaneIDs)
		require.Equal(t, []spate.SplitID{sid("a")}, f.coord.releaseDrained)
		require.Equal(t, []int64{3, 5}, watermarks(f.coord.commits["a"]), "no extra commit: the last one covered all it emitted")
		f.expect(pipeline.Idle)
		require.Len(t, f.coord.releaseDrained, 1, "released more than once")
	})
	t.Run("a drain that reaches the split's end completes it", func(t *testing.T) {
		f, pa, lane := setup(t)
		f.src.completeAt["a"] = 5
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
		ev := f.expect(pipeline.LanesRetired)
		require.Equal(t, []pipeline.LaneID{lane.ID()}, ev.LaneIDs)
		got := f.coord.commits["a"]
		require.Len(t, got, 1)
		require.True(t, got[0].Completed)
		require.Empty(t, f.coord.releaseDrained, "a completed split is not handed back")
	})
	t.Run("a deferred commit is made by the drain", func(t *testing.T) {
		f, pa, _ := setup(t)
		fail := true
		f.coord.commitErr = func(spate.SplitID, spate.SplitProgress) error {
			if fail {
				return spate.Retryablef("slow")
			}
			return nil
		}
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
		f.expect(pipeline.Idle)
		require.Empty(t, f.coord.releaseDrained)
		fail = false
		f.expect(pipeline.LanesRetired)
		require.Equal(t, []int64{5}, watermarks(f.coord.commits["a"]))
		require.Equal(t, []spate.SplitID{sid("a")}, f.coord.releaseDrained)
	})
	t.Run("a fenced final commit turns the drain into a revoke", func(t *testing.T) {
		f, pa, lane := setup(t)
		f.coord.commitErr = func(spate.SplitID, spate.SplitProgress) error { return spate.Fencedf("gone") }
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
		ev := f.expect(pipeline.LanesRevoked)
		require.Equal(t, []pipeline.LaneID{lane.ID()}, ev.LaneIDs)
		require.Empty(t, f.coord.releaseDrained, "a fenced drain must revoke, not hand back")
	})
	t.Run("a lane that emitted nothing hands back at once", func(t *testing.T) {
		f := newDriverFixture(t)
		f.coord.push(gained("b", 1))
		f.expect(pipeline.LanesAdded)
		f.coord.push(spate.RevokeRequested{Split: sid("b")})
		f.expect(pipeline.LanesRetired)
		require.Equal(t, []spate.SplitID{sid("b")}, f.coord.releaseDrained)
		require.Empty(t, f.coord.commits["b"])
	})
}

// 67
func TestDriverRevocationDeclines(t *testing.T) {
	f := newDriverFixture(t)
	f.src.declineDrain = true
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	f.coord.push(spate.RevokeRequested{Split: sid("a")}, spate.RevokeRequested{Split: sid("zz")})
	f.expect(pipeline.Idle)
	require.Equal(t, []spate.SplitID{sid("a")}, f.coord.declines, "declines: once for a, none for an unheld split")

	g := newDriverFixture(t)
	g.src.emit["a"] = 1
	g.coord.push(gained("a", 1))
	lane := g.expect(pipeline.LanesAdded).Lanes[0]
	b, _ := lane.Poll(10, 0)
	b.Ack.Release()
	g.coord.push(spate.RevokeRequested{Split: sid("a")})
	g.expect(pipeline.CommitReady)
	g.coord.push(spate.RevokeRequested{Split: sid("a")})
	g.expect(pipeline.Idle)
	require.Empty(t, g.coord.declines, "a repeated revoke mid-drain must be a no-op")
	require.Len(t, g.src.begun, 1, "a repeated revoke mid-drain must be a no-op")

	// An unopened tenancy declines without consulting the source.
	h := newDriverFixture(t)
	h.coord.push(gained("a", 1), spate.RevokeRequested{Split: sid("a")})
	h.expect(pipeline.LanesAdded)
	require.Empty(t, h.src.begun, "an unopened tenancy does not consult the source")
	require.Equal(t, []spate.SplitID{sid("a")}, h.coord.declines, "an unopened tenancy declines")
}

// fakeStaging is a StagingSink whose Prepare covers what cover says.
type fakeStaging struct {
	mu        sync.Mutex
	cover     func(w int64, final bool) int64
	prepares  []string
	published []string
	// seals: like the file sink, a final Prepare seals the stage, and a
	// later one past its watermark fails (sealedAt is that watermark).
	seals    bool
	sealedAt int64
	sealed   bool
}

func (f *fakeStaging) Write(context.Context, int, []pipeline.Record) error { return nil }
func (f *fakeStaging) OpenStage(context.Context, pipeline.StageTenancy, []byte) error {
	return nil
}
func (f *fakeStaging) Prepare(_ context.Context, _ pipeline.PartitionID, w int64, final bool) ([]byte, int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prepares = append(f.prepares, fmt.Sprintf("%d/%t", w, final))
	if f.sealed && w > f.sealedAt {
		return nil, 0, false, fmt.Errorf("a commit at %d past the final commit at %d: the stage is sealed", w, f.sealedAt)
	}
	if f.seals && final {
		f.sealed, f.sealedAt = true, w
	}
	c := f.cover(w, final)
	return []byte(fmt.Sprint(c)), c, true, nil
}
func (f *fakeStaging) Publish(_ context.Context, _ pipeline.PartitionID, c []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published = append(f.published, string(c))
	return nil
}
func (f *fakeStaging) CloseStage(pipeline.PartitionID, bool) {}

// A staging sink that covers less than the watermark (it rolls parts) has
// the coordination driver commit what it covers, nothing when that is no
// more than the last commit, and the whole acknowledged watermark at the
// hand-back.
func TestDriverCommitsWhatTheStagingSinkCovers(t *testing.T) {
	f := newDriverFixture(t)
	cut := int64(0)
	stage := &fakeStaging{cover: func(w int64, final bool) int64 {
		if final {
			return w
		}
		return min(cut, w)
	}}
	require.NoError(t, f.d.StageOutput(stage))
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	pa := f.partitionOf("a")

	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
	require.Empty(t, f.coord.commits["a"], "no part cut: nothing to commit")
	cut = 6
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 8}}))
	got := f.coord.commits["a"]
	require.Len(t, got, 1)
	require.Equal(t, int64(6), got[0].Watermark, "the commit covers what the sink's parts cover")
	require.Equal(t, []byte("6"), got[0].Output)
	require.Equal(t, []string{"6"}, stage.published)

	require.NoError(t, f.d.Release(context.Background(), f.src))
	got = f.coord.commits["a"]
	require.Len(t, got, 2)
	require.Equal(t, int64(8), got[1].Watermark, "the hand-back's final commit covers all acknowledged")
	require.Equal(t, []string{"5/false", "8/false", "8/true"}, stage.prepares)
}

// A drain's commit of what is acknowledged so far is not its final one:
// only the commit that covers all the stopped lane emitted is. A staging
// sink seals its stage at a final commit (the file sink does), so a chase
// commit made final before the last acknowledgments left the drain's own
// commit of the rest refused, and the split held until the coordinator
// forced its revocation at the deadline (a division's freshly gained
// child, moved while its first batches were in flight).
func TestDriverDrainCommitsFinalOnlyAtItsEnd(t *testing.T) {
	f := newDriverFixture(t)
	stage := &fakeStaging{seals: true, cover: func(w int64, _ bool) int64 { return w }}
	require.NoError(t, f.d.StageOutput(stage))
	f.src.emit["a"] = 5
	f.coord.push(gained("a", 1))
	lane := f.expect(pipeline.LanesAdded).Lanes[0]
	b, err := lane.Poll(100, 0)
	require.NoError(t, err)
	require.Len(t, b.Payloads, 5)
	b.Ack.Release()
	f.coord.push(spate.RevokeRequested{Split: sid("a")})
	f.expect(pipeline.CommitReady)
	pa := f.partitionOf("a")

	// Records 0..2 acknowledged: the chase commits them, not as final.
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 3}}))
	f.expect(pipeline.Idle)
	require.Empty(t, f.coord.releaseDrained, "records 3 and 4 are not acknowledged yet")
	// The rest acknowledged: the drain's last commit, then the hand-back.
	require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
	ev := f.expect(pipeline.LanesRetired)
	require.Equal(t, []pipeline.LaneID{lane.ID()}, ev.LaneIDs)
	require.Equal(t, []spate.SplitID{sid("a")}, f.coord.releaseDrained, "the drained split was not handed back")
	var got []int64
	for _, p := range f.coord.commits["a"] {
		got = append(got, p.Watermark)
	}
	require.Equal(t, []int64{3, 5}, got)
	require.Equal(t, []string{"3/false", "5/true"}, stage.prepares, "only the drain's last commit is final")
}

// One Commit call commits its splits side by side, not one after another:
// each of four commits here waits until all four are in flight, which
// one-at-a-time commits never reach. Every split's prepare, commit,
// publish and completion still happen, each once.
func TestDriverCommitsSplitsConcurrently(t *testing.T) {
	f := newDriverFixture(t)
	stage := &fakeStaging{cover: func(w int64, _ bool) int64 { return w }}
	require.NoError(t, f.d.StageOutput(stage))
	names := []string{"a", "b", "c", "d"}
	var evs []spate.Event
	for _, n := range names {
		evs = append(evs, gained(n, 1))
	}
	f.coord.push(evs...)
	f.expect(pipeline.LanesAdded)
	var (
		arrived sync.WaitGroup
		all     = make(chan struct{})
	)
	arrived.Add(len(names))
	go func() { arrived.Wait(); close(all) }()
	f.coord.commitGate = func(spate.SplitID) error {
		arrived.Done()
		select {
		case <-all:
			return nil
		case <-time.After(10 * time.Second):
			return spate.Fatalf("the commits ran one at a time: not all %d were ever in flight together", len(names))
		}
	}
	var ws []pipeline.Watermark
	for _, n := range names {
		ws = append(ws, pipeline.Watermark{Partition: f.partitionOf(n), Offset: 7})
	}
	require.NoError(t, f.d.Commit(f.src, ws))
	f.coord.commitGate = nil
	for _, n := range names {
		got := f.coord.commits[n]
		require.Len(t, got, 1, "split %s", n)
		require.Equal(t, int64(7), got[0].Watermark)
	}
	stage.mu.Lock()
	defer stage.mu.Unlock()
	require.Len(t, stage.prepares, len(names))
	require.Len(t, stage.published, len(names))
}
