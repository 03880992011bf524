package conformance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance/internal/kit"
	"github.com/spate-go/spate/faultstore"
)

// A fleet is a set of workers sharing one harness namespace, each running a
// StoreCoordinator over its own store client behind its own fault injector,
// driven by a simulated source. Tests pump it until a condition holds.
type fleet struct {
	e       *env // the rule's: every worker's store is bounded through it
	t       testing.TB
	h       Harness
	ctx     context.Context
	cfg     spate.Config
	planner spate.SplitPlanner
	workers []*worker
	tick    time.Duration

	mu       sync.Mutex
	commits  map[string][]commitRecord // per split, successful commits in order
	attempts map[string][]commitRecord // per split, every commit attempted
}

type commitRecord struct {
	worker    string
	epoch     spate.LeaseEpoch
	watermark int64
	completed bool
}

// revokePolicy is how a simulated source answers RevokeRequested.
type revokePolicy uint8

const (
	revokeAccept  revokePolicy = iota // drain: final commit, then ReleaseDrained
	revokeDecline                     // DeclineRevoke at once
	revokeIgnore                      // do nothing (the deadline forces it)
	revokeStall                       // stop intake, never finish (a wedged drain)
	revokeSlow                        // stop intake, keep committing, never finish
)

// tenancyState is a simulated source's state for one held split.
type tenancyState struct {
	gained    spate.Gained
	watermark int64 // next record to process (one past the last processed)
	committed int64
	draining  bool
	fenced    bool
}

type worker struct {
	f     *fleet
	name  string
	id    string
	c     *spate.StoreCoordinator
	store spate.Store
	inj   *faultstore.Injector
	waker spate.Waker

	// Behaviour.
	records     int64 // records per split; a split completes after them
	perTick     int64 // records processed per pump
	commitEvery int64 // commit after this many records
	revoke      revokePolicy
	failIf      func(id string) bool // Fail matching gained splits (poison)
	frozen      bool                 // process nothing (a source that stopped reading)
	cfgMod      func(*spate.Config)
	expectErr   bool // the worker is expected to fail
	fails       int  // Fail calls made
	// beforeRelease, when set, runs after a drain's last commit and
	// before its ReleaseDrained (the lifecycle measurement marks the release there).
	beforeRelease func(id string)

	held    map[string]*tenancyState
	events  []spate.Event
	gains   []spate.Gained
	losses  []string
	revokes []string
	err     error
	dead    bool
}

type workerOpt func(*worker)

func withID(id string) workerOpt                 { return func(w *worker) { w.id = id } }
func withRevoke(p revokePolicy) workerOpt        { return func(w *worker) { w.revoke = p } }
func withRecords(n int64) workerOpt              { return func(w *worker) { w.records = n } }
func withCommitEvery(n int64) workerOpt          { return func(w *worker) { w.commitEvery = n } }
func withPerTick(n int64) workerOpt              { return func(w *worker) { w.perTick = n } }
func withFailIf(f func(string) bool) workerOpt   { return func(w *worker) { w.failIf = f } }
func withExpectErr() workerOpt                   { return func(w *worker) { w.expectErr = true } }
func withFrozen() workerOpt                      { return func(w *worker) { w.frozen = true } }
func withConfig(f func(*spate.Config)) workerOpt { return func(w *worker) { w.cfgMod = f } }

// testConfig is the coordinator configuration the suite runs with: the
// store's TTL as the lease, renewals and reconciles well inside it.
func testConfig(ttl time.Duration) spate.Config {
	op := min(ttl/4, time.Second)
	return spate.Config{
		LeaseDuration:     ttl,
		OpTimeout:         op,
		ReplanInterval:    ttl,
		ReconcileInterval: max(ttl/5, 300*time.Millisecond),
		DrainDeadline:     max(ttl/2, op),
		RebalanceDelay:    spate.NoRebalanceDelay,
		MaxInFlight:       8,
	}
}

func newFleet(e *env, planner spate.SplitPlanner) *fleet {
	probe := e.open()
	ttl := probe.Capabilities().TTL
	f := &fleet{e: e, t: e.t, h: e.h, ctx: e.ctx, cfg: testConfig(ttl), planner: planner,
		tick: 20 * time.Millisecond, commits: map[string][]commitRecord{}, attempts: map[string][]commitRecord{}}
	e.t.Cleanup(func() {
		for _, w := range f.workers {
			w.stop()
		}
	})
	return f
}

// testLogger is quiet unless SPATE_TEST_LOG is set.
var testLogger = kit.Logger

// start adds a worker and starts its coordinator.
func (f *fleet) start(name string, opts ...workerOpt) *worker {
	f.t.Helper()
	w := f.startPaused(name, opts...)
	f.launch(w)
	return w
}

// startPaused adds a worker whose coordinator is built but not started, so
// a test can install fault rules first; launch starts it.
func (f *fleet) startPaused(name string, opts ...workerOpt) *worker {
	f.t.Helper()
	return f.startPausedWith(name, nil, opts...)
}

// startPausedWith is startPaused with wrap around the worker's (fault
// injected) store, e.g. to record what the coordinator sees.
func (f *fleet) startPausedWith(name string, wrap func(spate.Store) spate.Store, opts ...workerOpt) *worker {
	f.t.Helper()
	w := &worker{f: f, name: name, id: name, records: 20, perTick: 1, commitEvery: 5,
		held: map[string]*tenancyState{}, waker: spate.NewWaker(), inj: faultstore.New()}
	for _, o := range opts {
		o(w)
	}
	s, err := openStore(f.ctx, f.h)
	if err != nil {
		f.t.Fatalf("harness: open store: %v", err)
	}
	// Every call the worker's coordinator makes is bounded
	// (boundstore.go): a driver call that never returns fails the rule
	// naming the call. The suite's own faults go on top, unbounded.
	s = bind(f.e, s)
	w.store = s
	cfg := f.cfg
	cfg.InstanceID = w.id
	if w.cfgMod != nil {
		w.cfgMod(&cfg)
	}
	var st spate.Store = faultstore.Wrap(s, w.inj)
	if wrap != nil {
		st = wrap(st)
	}
	c, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(testLogger(name)))
	if err != nil {
		f.t.Fatalf("worker %s: %v", name, err)
	}
	c.SetWaker(w.waker)
	w.c = c
	f.workers = append(f.workers, w)
	return w
}

func (f *fleet) launch(w *worker) {
	f.t.Helper()
	if err := w.c.Start(f.planner); err != nil {
		f.t.Fatalf("worker %s: start: %v", w.name, err)
	}
}

// kill simulates a crash: the store becomes unreachable for this worker and
// its coordinator stops without handing anything back.
func (w *worker) kill() {
	w.inj.Partition()
	w.stop()
}

// stop closes the coordinator (a graceful close hands splits back) and the
// store client.
func (w *worker) stop() {
	if w.dead {
		return
	}
	w.dead = true
	_ = w.c.Close()
	_ = w.store.Close()
}

// pump polls every live worker once and plays its source.
func (f *fleet) pump() {
	for _, w := range f.workers {
		if !w.dead {
			w.pump()
		}
	}
}

func (w *worker) pump() {
	t := w.f.t
	evs, err := w.c.Poll()
	if err != nil {
		if w.err == nil {
			w.err = err
		}
		return
	}
	for _, ev := range evs {
		w.events = append(w.events, ev)
		switch e := ev.(type) {
		case spate.Gained:
			w.gains = append(w.gains, e)
			if prev, ok := w.held[e.Split.ID.String()]; ok && prev.gained.Epoch >= e.Epoch {
				t.Errorf("rule: a re-Gained split carries a higher epoch than the tenancy it replaces; %s gained %s at %d after %d",
					w.name, e.Split.ID, e.Epoch, prev.gained.Epoch)
			}
			st := &tenancyState{gained: e}
			if e.Progress != nil {
				st.watermark, st.committed = e.Progress.Watermark, e.Progress.Watermark
			}
			w.held[e.Split.ID.String()] = st
			if w.failIf != nil && w.failIf(e.Split.ID.String()) {
				w.fails++
				if err := w.c.Fail(w.f.ctx, e.Split.ID, "poison"); err != nil && !spate.IsFenced(err) {
					t.Logf("%s: fail %s: %v", w.name, e.Split.ID, err)
				}
				delete(w.held, e.Split.ID.String())
			}
		case spate.Lost:
			w.losses = append(w.losses, e.Split.String())
			delete(w.held, e.Split.String())
		case spate.RevokeRequested:
			w.revokes = append(w.revokes, e.Split.String())
			st, ok := w.held[e.Split.String()]
			if !ok {
				continue
			}
			switch w.revoke {
			case revokeAccept, revokeStall, revokeSlow:
				st.draining = true
			case revokeDecline:
				_ = w.c.DeclineRevoke(w.f.ctx, e.Split)
			}
		case spate.Quarantined:
			delete(w.held, e.Split.String())
		}
	}
	if w.frozen {
		return
	}
	for _, id := range sortedKeys(w.held) {
		st := w.held[id]
		sid := spate.MustSplitID(id)
		if st.draining {
			switch w.revoke {
			case revokeStall:
				continue
			case revokeSlow:
				w.commit(sid, st, false) // progress without an end
				continue
			}
			// Drain: commit everything processed, then hand back.
			if w.commit(sid, st, false) {
				if w.beforeRelease != nil {
					w.beforeRelease(id)
				}
				_ = w.c.ReleaseDrained(w.f.ctx, sid)
				delete(w.held, id)
			}
			continue
		}
		st.watermark = min(st.watermark+w.perTick, w.records)
		switch {
		case st.watermark >= w.records:
			if w.commit(sid, st, true) {
				delete(w.held, id)
			}
		case st.watermark-st.committed >= w.commitEvery:
			w.commit(sid, st, false)
		}
	}
}

// commit commits st's watermark and records the outcome. It reports whether
// the commit landed.
func (w *worker) commit(id spate.SplitID, st *tenancyState, completed bool) bool {
	p := spate.NewSplitProgress(st.watermark, []byte(fmt.Sprintf("state@%d", st.watermark)))
	p.Completed = completed
	w.f.mu.Lock()
	w.f.attempts[id.String()] = append(w.f.attempts[id.String()],
		commitRecord{worker: w.name, epoch: st.gained.Epoch, watermark: st.watermark, completed: completed})
	w.f.mu.Unlock()
	err := w.c.CommitAt(w.f.ctx, id, st.gained.Epoch, p)
	switch {
	case err == nil:
		st.committed = st.watermark
		w.f.mu.Lock()
		w.f.commits[id.String()] = append(w.f.commits[id.String()],
			commitRecord{worker: w.name, epoch: st.gained.Epoch, watermark: st.watermark, completed: completed})
		w.f.mu.Unlock()
		return true
	case spate.IsFenced(err):
		st.fenced = true
		delete(w.held, id.String())
	case spate.IsRetryable(err):
	default:
		if w.err == nil {
			w.err = err
		}
	}
	return false
}

// until pumps the fleet until cond holds, failing after d.
func (f *fleet) until(d time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for {
		f.pump()
		f.checkErrors()
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("waited %v for %s; %s", d, what, f.describe())
		}
		time.Sleep(f.tick)
	}
}

// hold pumps the fleet for d, failing if cond ever breaks.
func (f *fleet) hold(d time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		f.pump()
		f.checkErrors()
		if !cond() {
			f.t.Fatalf("%s stopped holding; %s", what, f.describe())
		}
		time.Sleep(f.tick)
	}
}

// checkErrors fails on any worker's unexpected error.
func (f *fleet) checkErrors() {
	f.t.Helper()
	for _, w := range f.workers {
		if w.err != nil && !w.expectErr {
			f.t.Fatalf("worker %s failed: %v", w.name, w.err)
		}
	}
}

func (f *fleet) describe() string {
	var b strings.Builder
	for _, w := range f.workers {
		fmt.Fprintf(&b, "%s(dead=%t held=%v err=%v) ", w.name, w.dead, sortedKeys(w.held), w.err)
	}
	return b.String()
}

func (w *worker) heldIDs() []string { return sortedKeys(w.held) }

func (w *worker) saw(pred func(spate.Event) bool) bool {
	return slices.ContainsFunc(w.events, pred)
}

func isAllComplete(e spate.Event) bool { _, ok := e.(spate.AllComplete); return ok }
func isStalled(e spate.Event) bool     { _, ok := e.(spate.Stalled); return ok }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkCommitHistory enforces, over every successful commit the fleet made:
// watermarks never regress across owners, and a commit after another
// worker's comes from a strictly higher epoch.
func (f *fleet) checkCommitHistory() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, cs := range f.commits {
		for i := 1; i < len(cs); i++ {
			if cs[i].watermark < cs[i-1].watermark {
				f.t.Errorf("rule: committed watermarks never regress; split %s went %d (%s@%d) -> %d (%s@%d)",
					id, cs[i-1].watermark, cs[i-1].worker, cs[i-1].epoch, cs[i].watermark, cs[i].worker, cs[i].epoch)
			}
			if cs[i].epoch < cs[i-1].epoch {
				f.t.Errorf("rule: a commit lands only for the current owner; split %s took a commit at epoch %d after one at epoch %d",
					id, cs[i].epoch, cs[i-1].epoch)
			}
		}
	}
}

// expectedProgress is what a tenancy gained at epoch must carry: the last
// commit of an earlier tenancy, else seed.
func (f *fleet) expectedProgress(id string, epoch spate.LeaseEpoch, seed *spate.SplitProgress) *spate.SplitProgress {
	f.mu.Lock()
	defer f.mu.Unlock()
	want := seed
	for _, c := range f.commits[id] {
		if c.epoch < epoch {
			p := spate.NewSplitProgress(c.watermark, []byte(fmt.Sprintf("state@%d", c.watermark)))
			p.Completed = c.completed
			want = &p
		}
	}
	return want
}

// checkCarried checks that every gain carried the expected progress.
func (f *fleet) checkCarried(w *worker, gains []spate.Gained, seed *spate.SplitProgress) {
	f.t.Helper()
	for _, g := range gains {
		want := f.expectedProgress(g.Split.ID.String(), g.Epoch, seed)
		got := g.Progress
		if (want == nil) != (got == nil) || want != nil && (got.Watermark != want.Watermark || string(got.State) != string(want.State)) {
			f.t.Errorf("rule: Gained carries the last committed progress (or the seed); %s gained %v, want %v", w.name, g, want)
		}
	}
}

// resumeBounds is where a tenancy gained at epoch may resume: at least the
// furthest commit acknowledged to an earlier tenancy, at most the furthest
// attempted by one (an attempt whose reply was lost may have landed). -1
// stands for "no progress".
func (f *fleet) resumeBounds(id string, epoch spate.LeaseEpoch, _ *worker) (lo, hi int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lo, hi = -1, -1
	for _, c := range f.commits[id] {
		if c.epoch < epoch {
			lo = max(lo, c.watermark)
		}
	}
	for _, c := range f.attempts[id] {
		if c.epoch < epoch {
			hi = max(hi, c.watermark)
		}
	}
	return lo, hi
}
