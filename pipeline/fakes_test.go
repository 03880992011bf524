package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// testConfig is the configuration the runtime scenarios use.
func testConfig() pipeline.Config {
	return pipeline.Config{
		Name:              "test",
		Threads:           1,
		CommitInterval:    20 * time.Millisecond,
		MaxPendingBatches: 1024,
		DrainTimeout:      3 * time.Second,
		StalledFailAfter:  120 * time.Second,
		MinPause:          10 * time.Millisecond,
		PollTimeout:       2 * time.Millisecond,
		IdleFlush:         20 * time.Millisecond,
		BlockedRetry:      time.Millisecond,
		EventPollTimeout:  5 * time.Millisecond,
	}
}

// eventLog is an ordered log shared by a fake source and its chains.
type eventLog struct {
	mu      sync.Mutex
	entries []string
}

func (l *eventLog) add(s string) {
	l.mu.Lock()
	l.entries = append(l.entries, s)
	l.mu.Unlock()
}

func (l *eventLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

// indexAfter is the index of the first entry equal to want at or after from.
func (l *eventLog) indexAfter(want string, from int) int {
	s := l.snapshot()
	for i := max(from, 0); i < len(s); i++ {
		if s[i] == want {
			return i
		}
	}
	return -1
}

// fakeLane serves scripted batches and issues a real AckRef per batch.
type fakeLane struct {
	id      pipeline.LaneID
	part    pipeline.PartitionID
	mu      sync.Mutex
	batches [][2]int64 // first offset, record count
	next    int
	issuer  *pipeline.AckIssuer
	forever bool // produce batches of 10 without end
}

func (l *fakeLane) ID() pipeline.LaneID             { return l.id }
func (l *fakeLane) Partition() pipeline.PartitionID { return l.part }

func (l *fakeLane) Poll(max int, timeout time.Duration) (*pipeline.Batch, error) {
	l.mu.Lock()
	var first, n int64
	switch {
	case l.next < len(l.batches):
		first, n = l.batches[l.next][0], l.batches[l.next][1]
		l.next++
	case l.forever:
		if len(l.batches) > 0 {
			last := l.batches[len(l.batches)-1]
			first = last[0] + last[1]
		}
		n = 10
		l.batches = append(l.batches, [2]int64{first, n})
		l.next++
	default:
		l.mu.Unlock()
		time.Sleep(timeout)
		return nil, nil
	}
	l.mu.Unlock()
	b := &pipeline.Batch{}
	for i := range n {
		b.Payloads = append(b.Payloads, pipeline.RawPayload{
			Value: []byte(fmt.Sprintf("v%d", first+i)), Partition: l.part, Offset: first + i,
		})
	}
	b.Ack = l.issuer.Issue(l.part, first+n-1)
	return b, nil
}

// laneSpec describes a lane the fake source builds once it has its issuer.
type laneSpec struct {
	id      pipeline.LaneID
	part    pipeline.PartitionID
	batches int   // batches of 10 records
	first   int64 // first offset
	size    int64 // records per batch (default 10)
	forever bool
}

type stepKind int

const (
	stepAssign stepKind = iota
	stepAdd
	stepRevoke
	stepDrained
	stepPanic
	stepWait
	stepRetire
	stepCommitReady
)

type step struct {
	kind  stepKind
	lanes []laneSpec
	ids   []pipeline.LaneID
	until func() bool
}

// fakeSource plays a script of source events, one per PollEvents call.
type fakeSource struct {
	pipeline.BaseSource
	log            *eventLog
	script         []step
	issuer         *pipeline.AckIssuer
	lanes          map[pipeline.LaneID]*fakeLane
	opened         atomic.Bool
	mu             sync.Mutex
	commits        map[pipeline.PartitionID]int64
	pauses         [][]pipeline.LaneID
	resumes        [][]pipeline.LaneID
	flushCommits   atomic.Int32
	failCommits    atomic.Bool
	readingOnStop  func() bool
	stopReading    atomic.Int32
	renewHeld      atomic.Int32
	commitsByStage []string
	openErr        error
	polls          atomic.Int32
	pollErr        error
	commitErr      error
	// deferCommits makes Commit return nil but defer every position, as a
	// CoordinatedSource does when its store refuses writes.
	deferCommits atomic.Bool
	deferred     []pipeline.PartitionID
}

// TakeDeferred implements pipeline.CommitDeferrer.
func (s *fakeSource) TakeDeferred() ([]pipeline.PartitionID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.deferred
	s.deferred = nil
	if len(d) == 0 {
		return nil, nil
	}
	return d, spate.Retryablef("scripted deferral")
}

func newFakeSource(log *eventLog, script ...step) *fakeSource {
	return &fakeSource{log: log, script: script, lanes: map[pipeline.LaneID]*fakeLane{}, commits: map[pipeline.PartitionID]int64{}}
}

func (s *fakeSource) Open(ctx pipeline.SourceCtx) error {
	s.issuer = ctx.Issuer
	s.opened.Store(true)
	return s.openErr
}

func (s *fakeSource) build(specs []laneSpec) []pipeline.Lane {
	var out []pipeline.Lane
	for _, sp := range specs {
		l := &fakeLane{id: sp.id, part: sp.part, issuer: s.issuer, forever: sp.forever}
		size := sp.size
		if size == 0 {
			size = 10
		}
		for i := range sp.batches {
			l.batches = append(l.batches, [2]int64{sp.first + int64(i)*size, size})
		}
		s.mu.Lock()
		s.lanes[sp.id] = l
		s.mu.Unlock()
		out = append(out, l)
	}
	return out
}

func (s *fakeSource) PollEvents(timeout time.Duration) (pipeline.SourceEvent, error) {
	s.polls.Add(1)
	if s.pollErr != nil {
		time.Sleep(timeout)
		return pipeline.SourceEvent{}, s.pollErr
	}
	if len(s.script) == 0 {
		time.Sleep(timeout)
		return pipeline.IdleEvent(), nil
	}
	st := s.script[0]
	switch st.kind {
	case stepWait:
		if !st.until() {
			time.Sleep(timeout)
			return pipeline.IdleEvent(), nil
		}
		s.script = s.script[1:]
		return pipeline.IdleEvent(), nil
	case stepDrained:
		// Idempotent: keep reporting it.
		s.log.add("drained-delivered")
		return pipeline.DrainedEvent(), nil
	}
	s.script = s.script[1:]
	switch st.kind {
	case stepAssign:
		return pipeline.AssignedEvent(s.build(st.lanes)...), nil
	case stepAdd:
		return pipeline.AddedEvent(s.build(st.lanes)...), nil
	case stepRevoke:
		s.log.add("revoke-delivered")
		ev, _ := pipeline.RevokedEvent(st.ids...)
		return ev, nil
	case stepPanic:
		panic("scripted source panic")
	case stepRetire:
		s.log.add("retire-delivered")
		return pipeline.RetiredEvent(st.ids...), nil
	case stepCommitReady:
		s.log.add("commit-ready-delivered")
		var parts []pipeline.PartitionID
		for _, id := range st.ids {
			parts = append(parts, pipeline.PartitionID(id))
		}
		return pipeline.CommitReadyEvent(parts...), nil
	}
	return pipeline.IdleEvent(), nil
}

func (s *fakeSource) Commit(ws []pipeline.Watermark) error {
	if s.commitErr != nil {
		return s.commitErr
	}
	if s.failCommits.Load() {
		s.log.add("commit-failed")
		return spate.Retryablef("scripted commit failure")
	}
	if s.deferCommits.Load() {
		s.mu.Lock()
		for _, w := range ws {
			s.deferred = append(s.deferred, w.Partition)
		}
		s.mu.Unlock()
		s.log.add("commit-deferred")
		return nil
	}
	s.mu.Lock()
	for _, w := range ws {
		s.commits[w.Partition] = max(s.commits[w.Partition], w.Offset)
	}
	s.mu.Unlock()
	s.log.add("commit")
	return nil
}

func (s *fakeSource) FlushCommits() error {
	s.flushCommits.Add(1)
	s.log.add("flush_commits")
	if s.failCommits.Load() {
		return spate.Retryablef("scripted flush failure")
	}
	return nil
}

func (s *fakeSource) Pause(l []pipeline.LaneID) error {
	s.mu.Lock()
	s.pauses = append(s.pauses, l)
	s.mu.Unlock()
	return nil
}

func (s *fakeSource) Resume(l []pipeline.LaneID) error {
	s.mu.Lock()
	s.resumes = append(s.resumes, l)
	s.mu.Unlock()
	return nil
}

func (s *fakeSource) ReadingOnStop() bool {
	if s.readingOnStop == nil {
		return false
	}
	return s.readingOnStop()
}

func (s *fakeSource) StopReading() error {
	s.stopReading.Add(1)
	s.log.add("stop_reading")
	return nil
}

func (s *fakeSource) RenewHeld() { s.renewHeld.Add(1) }

func (s *fakeSource) committed(p pipeline.PartitionID) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.commits[p]
	return o, ok
}

func (s *fakeSource) laneList() []*fakeLane {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*fakeLane
	for _, l := range s.lanes {
		out = append(out, l)
	}
	return out
}

func (s *fakeSource) pauseCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pauses)
}

type chainMode int

const (
	modeOK chainMode = iota
	modeBlockOnce
	modeBlockForever
	modeFatalAt
	modePanicAt
	modeFailAckAt
	modeHoldAcks
	modeHoldUntilFlush
	modeLeakAt // takes a reference of batch `at` and never gives it back
)

// fakeChain imitates an operator chain in one of several failure modes.
// Batch numbers are 1-based.
type fakeChain struct {
	mode     chainMode
	at       int
	log      *eventLog
	consumed *atomic.Int64
	flushes  *atomic.Int64
	held     *heldAcks
	batches  int
	blocked  bool
}

type heldAcks struct {
	mu   sync.Mutex
	refs []*pipeline.AckRef
}

func (h *heldAcks) add(a *pipeline.AckRef) {
	h.mu.Lock()
	h.refs = append(h.refs, a.Clone())
	h.mu.Unlock()
}

func (h *heldAcks) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.refs)
}

func (h *heldAcks) releaseAll() {
	h.mu.Lock()
	refs := h.refs
	h.refs = nil
	h.mu.Unlock()
	for _, a := range refs {
		a.Release()
	}
}

func (h *heldAcks) abandonAll() {
	h.mu.Lock()
	refs := h.refs
	h.refs = nil
	h.mu.Unlock()
	for _, a := range refs {
		a.Abandon()
	}
}

func (c *fakeChain) PushBatch(b *pipeline.Batch, from int) pipeline.PushOutcome {
	switch c.mode {
	case modeBlockForever:
		return pipeline.PushOutcome{Kind: pipeline.PushBlocked, ResumeAt: from, Reason: pipeline.BlockCapacity}
	case modeBlockOnce:
		if !c.blocked {
			c.blocked = true
			return pipeline.PushOutcome{Kind: pipeline.PushBlocked, ResumeAt: from, Reason: pipeline.BlockCapacity}
		}
	}
	c.batches++
	switch {
	case c.mode == modeFatalAt && c.batches == c.at:
		return pipeline.PushOutcome{Kind: pipeline.PushFatal, Err: &pipeline.FatalError{Component: "fake-chain", Reason: "scripted failure"}}
	case c.mode == modePanicAt && c.batches == c.at:
		panic("scripted chain panic")
	case c.mode == modeFailAckAt && c.batches == c.at:
		b.Ack.Fail()
	case c.mode == modeLeakAt && c.batches == c.at:
		b.Ack.Clone() // a bug: this reference is never released
	case c.mode == modeHoldAcks || c.mode == modeHoldUntilFlush:
		c.held.add(b.Ack)
	}
	c.consumed.Add(int64(len(b.Payloads) - from))
	return pipeline.PushOutcome{Kind: pipeline.PushDone}
}

func (c *fakeChain) Flush() pipeline.PushOutcome {
	c.flushes.Add(1)
	c.log.add("flush")
	if c.mode == modeHoldUntilFlush {
		c.held.releaseAll()
	}
	return pipeline.PushOutcome{Kind: pipeline.PushDone}
}

func (c *fakeChain) AbandonBatch() {}

func (c *fakeChain) Close() { c.held.abandonAll() }

// harness wires a fake source and fake chains into a runtime.
type harness struct {
	t        *testing.T
	log      *eventLog
	src      *fakeSource
	consumed atomic.Int64
	flushes  atomic.Int64
	held     heldAcks
	drained  atomic.Bool
	rt       *pipeline.Runtime
}

func newHarness(t *testing.T, cfg pipeline.Config, mode chainMode, at int, script ...step) *harness {
	t.Helper()
	return newHarnessWith(t, cfg, nil, mode, at, script...)
}

// newHarnessWith is newHarness with runtime options.
func newHarnessWith(t *testing.T, cfg pipeline.Config, opts []pipeline.Option, mode chainMode, at int, script ...step) *harness {
	t.Helper()
	h := &harness{t: t, log: &eventLog{}}
	h.src = newFakeSource(h.log, script...)
	chains := func(int) pipeline.Chain {
		return &fakeChain{mode: mode, at: at, log: h.log, consumed: &h.consumed, flushes: &h.flushes, held: &h.held}
	}
	sinks := pipeline.SinkHooks{
		QueuesBelow: func(float64) bool { return true },
		Drain: func(context.Context) pipeline.DrainReport {
			h.drained.Store(true)
			return pipeline.DrainReport{}
		},
	}
	rt, err := pipeline.New(cfg, h.src, chains, sinks, nil, opts...)
	require.NoError(t, err)
	h.rt = rt
	return h
}

// run starts the runtime and returns a function that waits for its report.
func (h *harness) run() func() pipeline.ExitReport {
	type res struct{ r pipeline.ExitReport }
	ch := make(chan res, 1)
	go func() {
		r, _ := h.rt.Run(context.Background())
		ch <- res{r}
	}()
	return func() pipeline.ExitReport {
		select {
		case r := <-ch:
			assert.Zero(h.t, r.r.UnresolvedAcks, "%d acknowledgment handles leaked", r.r.UnresolvedAcks)
			return r.r
		case <-time.After(30 * time.Second):
			require.Fail(h.t, "Run did not return within 30s")
			return pipeline.ExitReport{}
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "timed out waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}

func lane(id, part, batches int) laneSpec {
	return laneSpec{id: pipeline.LaneID(id), part: pipeline.PartitionID(part), batches: batches}
}

func assign(l ...laneSpec) step { return step{kind: stepAssign, lanes: l} }
func add(l ...laneSpec) step    { return step{kind: stepAdd, lanes: l} }
func revoke(ids ...int) step {
	var out []pipeline.LaneID
	for _, i := range ids {
		out = append(out, pipeline.LaneID(i))
	}
	return step{kind: stepRevoke, ids: out}
}
func retire(ids ...int) step {
	st := revoke(ids...)
	st.kind = stepRetire
	return st
}
func commitReady(parts ...int) step {
	st := revoke(parts...)
	st.kind = stepCommitReady
	return st
}
func waitUntil(f func() bool) step { return step{kind: stepWait, until: f} }
func drained() step                { return step{kind: stepDrained} }

func wm(p, o int) pipeline.Watermark {
	return pipeline.Watermark{Partition: pipeline.PartitionID(p), Offset: int64(o)}
}
