package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
)

// The starvation scenarios: a worker under load keeps its leases. Lease
// and presence renewal have their own schedule and are never queued behind
// commits, listings or other store I/O; commits on different splits run
// concurrently. Each scenario loads one worker for a few leases and then
// checks that it reported no Lost, that its commits succeeded, and that
// the store still shows every split owned and leased by it, at the epoch it
// gained it, with no delivery attempt charged.

// starvationSeed seeds the lanes' jitter, so a failure replays.
const starvationSeed = 0x5eed_57a4

// starvationConfig is the configuration of the starvation scenarios. It is
// the suite's testConfig, not the product's defaults: a coordinator's lease
// must equal the store's TTL, which the harnesses keep at 1.5–2 s, and at
// that lease the defaults are invalid (a 10 s OpTimeout breaks lease >=
// 2×OpTimeout) or never fire within a scenario (a 30 s reconcile), so the
// knobs tied to the lease are scaled as testConfig scales them. Two knobs
// keep the product's choice: the lane budget is the default unless the
// scenario holds more splits, and the reconcile interval keeps the
// default's proportion to the lease (30 s of 30 s: one lease), so that a
// listing runs as often, relative to renewals, as it does in production.
func starvationConfig(ttl time.Duration, splits int) spate.Config {
	cfg := testConfig(ttl)
	cfg.MaxInFlight = max(spate.DefaultMaxInFlight, splits)
	cfg.ReconcileInterval = time.Duration(float64(ttl) *
		float64(spate.DefaultReconcileInterval) / float64(spate.DefaultLeaseDuration))
	return cfg
}

// scenConcurrentCommitters: one worker holding n splits and n goroutines,
// each committing its own split back to back for three leases, for n = 2,
// 4, 16 and 64, each on a fresh namespace. Once the worker holds its
// splits, its store answers after a round trip of lease/300 (100 ms under
// a 30 s lease; on a server, on top of its own): over stores/mem in
// virtual time a commit must wait on something for the clock to move. The
// worker must lose nothing, every commit must succeed, and the store must
// still show each split owned by the worker at its first epoch with no
// attempt charged. A commit that ran out of its op timeout while a witness
// (see witness) saw the store itself stall for half of it is not held
// against the coordinator; it is counted in the log.
func scenConcurrentCommitters(e *env) {
	for i, n := range []int{2, 4, 16, 64} {
		func() {
			h := e.h
			if i > 0 {
				h = e.mk(e.t)
				defer closeHarness(e.t, h)
			}
			raw, err := openStore(e.ctx, h)
			require.NoError(e.t, err, "harness: open store")
			raw = bind(e, raw)
			defer raw.Close()
			ttl := raw.Capabilities().TTL
			cfg := starvationConfig(ttl, n)
			// A commit is one compare-and-swap bounded by OpTimeout. How
			// long the store takes for one while n others are in flight is
			// the store's (and the machine's), not the coordinator's: it is
			// measured here, and the op timeout derives from it.
			rt := casRoundTrip(e, raw, fmt.Sprintf("rt%d.", n), n)
			cfg.OpTimeout = commitOpTimeout(cfg.OpTimeout, ttl, rt+ttl/300)
			w := startSolo(e, h, "committer", cfg, planOf(fmt.Sprintf("committers%d", n), n))
			defer w.stop()
			w.waitHolding(n)
			w.inj.Add(faultstore.Rule{Delay: ttl / 300})
			wit := startWitness(e, h, fmt.Sprintf("witness%d.k", n), ttl/300, cfg.OpTimeout/2)
			st := w.runLanes(3*ttl, backToBack)
			wit.stop()
			excused := st.excuse(wit)
			w.pollFor(ttl / 2)
			e.t.Logf("n=%d: %d commits in 3 leases (%.0f/s), %d failed, %d of them while the store itself stalled; %d concurrent compare-and-swaps took up to %v before the load, op timeout %v; the witness's compare-and-swaps took up to %v during the load",
				n, st.commits, float64(st.commits)/(3*ttl).Seconds(), st.failures+excused, excused, n, rt, cfg.OpTimeout, wit.slowest)
			w.checkStarvation(raw, n, st,
				fmt.Sprintf("rule: lease renewal is never queued behind commits (%d goroutines committing back to back for 3 leases)", n),
				fmt.Sprintf("rule: concurrent commits on different splits all succeed on a healthy store (%d goroutines; the store's compare-and-swap took up to %v at that concurrency before the load, plus the injected %v; op timeout %v)",
					n, rt, ttl/300, cfg.OpTimeout))
		}()
	}
}

// A witness measures the store itself while a scenario loads it: from a
// store of its own (another connection, as another process would hold,
// outside the coordinator and its injected faults) it updates one durable
// key of its own, one compare-and-swap at a time, pace apart, and keeps
// every call that took at least stall. A server can stop answering for a
// while by itself (a NATS file store compacting its blocks under a
// stream of updates, a machine starved of CPU by other processes): a
// commit in flight then outlasts its op timeout whatever the coordinator
// does, and the witness's call in flight is slow too. A coordinator that
// queues commits behind each other (what ConcurrentCommitters catches)
// slows its own commits and not the witness's calls.
type witness struct {
	e      *env
	stall  time.Duration
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	slowest time.Duration
	slow    []span // the calls that took at least stall
	err     error
}

// span is one call's start and end.
type span struct{ start, end time.Time }

func (a span) overlaps(b span) bool { return !a.end.Before(b.start) && !b.end.Before(a.start) }

func startWitness(e *env, h Harness, key string, pace, stall time.Duration) *witness {
	e.t.Helper()
	s, err := openStore(e.ctx, h)
	require.NoError(e.t, err, "harness: open the witness's store")
	s = bind(e, s)
	o, err := s.Create(e.ctx, spate.Durable, key, []byte("0"))
	if err == nil && !o.Won {
		err = fmt.Errorf("create %q: key exists", key)
	}
	if err != nil {
		_ = s.Close()
		require.NoError(e.t, err, "the witness's key")
	}
	ctx, cancel := context.WithCancel(e.ctx)
	wit := &witness{e: e, stall: stall, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(wit.done)
		defer s.Close()
		rev := o.Revision
		for i := 1; sleepCtx(ctx, pace); i++ {
			// On the test's context, as a lane's commit: the end of the
			// load must not cut the call short.
			start := time.Now()
			o, err := s.Update(e.ctx, spate.Durable, key, []byte(fmt.Sprint(i)), rev)
			end := time.Now()
			if err == nil && !o.Won {
				err = fmt.Errorf("update %q at revision %d: lost, yet only the witness writes it", key, rev)
			}
			wit.mu.Lock()
			wit.slowest = max(wit.slowest, end.Sub(start))
			if end.Sub(start) >= stall {
				wit.slow = append(wit.slow, span{start, end})
			}
			if err != nil && !spate.IsRetryable(err) {
				wit.err = err
			}
			wit.mu.Unlock()
			if wit.err != nil {
				return
			}
			if err == nil {
				rev = o.Revision
			}
		}
		_, _ = s.Delete(e.ctx, spate.Durable, key, rev)
	}()
	return wit
}

// stop ends the witness's calls and fails the rule if the store refused
// one for good.
func (wit *witness) stop() {
	wit.cancel()
	<-wit.done
	require.NoError(wit.e.t, wit.err, "the witness's compare-and-swap")
}

// stalled reports whether the witness saw the store stall during sp.
func (wit *witness) stalled(sp span) bool {
	wit.mu.Lock()
	defer wit.mu.Unlock()
	for _, s := range wit.slow {
		if s.overlaps(sp) {
			return true
		}
	}
	return false
}

// longestDuring is the longest call of the witness's that took at least
// its stall and overlapped sp; 0 if none did.
func (wit *witness) longestDuring(sp span) time.Duration {
	wit.mu.Lock()
	defer wit.mu.Unlock()
	var d time.Duration
	for _, s := range wit.slow {
		if s.overlaps(sp) {
			d = max(d, s.end.Sub(s.start))
		}
	}
	return d
}

// scenSlowStoreLanes: every store operation of the worker takes a round
// trip of lease/100 (100 ms under a 10 s lease), and 16 lanes each commit
// their split every lease/20 to lease/10 (jittered, seeded) for three
// leases. The worker must lose nothing, every commit must succeed, and no
// attempt may be charged.
func scenSlowStoreLanes(e *env) {
	const lanes = 16
	raw := e.open()
	ttl := raw.Capabilities().TTL
	w := startSolo(e, e.h, "slow-lanes", starvationConfig(ttl, lanes), planOf("slowlanes", lanes),
		faultstore.Rule{Delay: ttl / 100})
	w.waitHolding(lanes)
	st := w.runLanes(3*ttl, jittered(ttl/20, ttl/10))
	w.pollFor(ttl / 2)
	e.t.Logf("%d commits in 3 leases, %d failed", st.commits, st.failures)
	w.checkStarvation(raw, lanes, st,
		"rule: lease renewal is never queued behind commits on a slow store (every op lease/100, 16 lanes committing every lease/20..lease/10)",
		"rule: commits on a slow but healthy store succeed (at most one in flight per split, none queued behind the others)")
}

// scenSlowListings: every listing of the worker takes half a lease, within
// the listing deadline, while it holds four splits and commits each every
// lease/10 to lease/5 for four leases (a few reconciles). The worker must
// lose nothing, no commit may fail, and no attempt may be charged.
func scenSlowListings(e *env) {
	const splits = 4
	raw := e.open()
	ttl := raw.Capabilities().TTL
	cfg := starvationConfig(ttl, splits)
	slow := ttl / 2
	// A listing's deadline is max(3×OpTimeout, lease/3) (see
	// NewStoreCoordinator): the slow listing must succeed, not time out.
	require.Lessf(e.t, slow, max(3*cfg.OpTimeout, ttl/3), "the scenario's listing delay must stay under the listing deadline")
	w := startSolo(e, e.h, "slow-lists", cfg, planOf("slowlists", splits),
		faultstore.Rule{Ops: []faultstore.Op{faultstore.List}, Delay: slow})
	w.waitHolding(splits)
	st := w.runLanes(4*ttl, jittered(ttl/10, ttl/5))
	w.pollFor(ttl / 2)
	e.t.Logf("%d commits in 4 leases, %d failed, %d slow listings", st.commits, st.failures, w.inj.Injected())
	require.GreaterOrEqualf(e.t, w.inj.Injected(), 2, "the worker never listed (reconcile interval %v): the scenario tested nothing", cfg.ReconcileInterval)
	w.checkStarvation(raw, splits, st,
		"rule: a listing never delays lease renewal (every List takes lease/2, within its deadline)",
		"rule: a commit never waits behind a listing")
}

// casRoundTripRounds is how many compare-and-swaps each of casRoundTrip's
// goroutines makes.
const casRoundTripRounds = 4

// casRoundTrip measures the store's compare-and-swap round trip at the
// concurrency of a scenario: n goroutines each create a durable key of its
// own under prefix and update it back to back, casRoundTripRounds times,
// then delete it. It returns the slowest update: what one commit among n
// in flight costs on this store, on this machine, now (a loaded machine
// makes it longer; in a bubble it is 0).
func casRoundTrip(e *env, raw spate.Store, prefix string, n int) time.Duration {
	e.t.Helper()
	var (
		mu      sync.Mutex
		slowest time.Duration
		wg      sync.WaitGroup
		errs    = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("%sk%d", prefix, i)
			o, err := raw.Create(e.ctx, spate.Durable, key, []byte("0"))
			if err == nil && !o.Won {
				err = fmt.Errorf("create %q: key exists", key)
			}
			rev := o.Revision
			for r := 1; err == nil && r <= casRoundTripRounds; r++ {
				start := time.Now()
				o, err = raw.Update(e.ctx, spate.Durable, key, []byte(fmt.Sprint(r)), rev)
				took := time.Since(start)
				if err == nil && !o.Won {
					err = fmt.Errorf("update %q at revision %d: lost", key, rev)
				}
				rev = o.Revision
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
			}
			if err == nil {
				_, err = raw.Delete(e.ctx, spate.Durable, key, rev)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(e.t, err, "measuring the store's compare-and-swap round trip (%d at once)", n)
	}
	return slowest
}

// commitOpTimeout is the op timeout of a scenario whose commits each cost
// a measured round trip rt: ten of it, never below the suite's own (op)
// and never above half the lease (a lease must cover two op timeouts).
// Ten, because the measurement is a few hundred round trips and the load
// thousands of commits over three leases, beside renewals and polls: on
// etcd the measurement's slowest was about the load's average (64 at once:
// 54 ms, and 1,194 commits/s), and a loaded CI run had commits past four
// times its average (154 of 3,038 past 500 ms, average 126 ms).
func commitOpTimeout(op, ttl, rt time.Duration) time.Duration {
	return min(max(op, 10*rt), ttl/2)
}

// backToBack paces every lane with no pause between commits.
func backToBack(int) func() time.Duration { return func() time.Duration { return 0 } }

// jittered paces each lane at a uniform interval in [lo, hi], from a
// per-lane generator seeded with starvationSeed.
func jittered(lo, hi time.Duration) func(lane int) func() time.Duration {
	return func(lane int) func() time.Duration {
		rng := rand.New(rand.NewPCG(starvationSeed, uint64(lane)))
		return func() time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	}
}

// A soloWorker is one coordinator driven the way a pipeline drives it: the
// test goroutine polls its events while lanes, one goroutine per held
// split, commit concurrently. (The fleet's worker commits from its pump,
// one split after another, so it cannot put concurrent commits on a
// coordinator.)
type soloWorker struct {
	e     *env
	name  string
	c     *spate.StoreCoordinator
	store spate.Store
	inj   *faultstore.Injector
	waker spate.Waker
	once  sync.Once

	gained  map[string]spate.Gained // each split's first tenancy
	regains []spate.Gained          // tenancies gained again after a loss
	lost    []string
}

// startSolo starts a worker on h whose store has rules installed from the
// start.
func startSolo(e *env, h Harness, name string, cfg spate.Config, p spate.SplitPlanner, rules ...faultstore.Rule) *soloWorker {
	e.t.Helper()
	s, err := openStore(e.ctx, h)
	require.NoError(e.t, err, "harness: open store")
	s = bind(e, s) // every call of the coordinator bounded (boundstore.go)
	w := &soloWorker{e: e, name: name, store: s, inj: faultstore.New(), waker: spate.NewWaker(), gained: map[string]spate.Gained{}}
	for _, r := range rules {
		w.inj.Add(r)
	}
	cfg.InstanceID = name
	w.c, err = spate.NewStoreCoordinator(faultstore.Wrap(s, w.inj), cfg, spate.WithLogger(testLogger(name)))
	if err != nil {
		_ = s.Close()
		require.NoError(e.t, err, "worker %s", name)
	}
	w.c.SetWaker(w.waker)
	e.t.Cleanup(w.stop)
	require.NoError(e.t, w.c.Start(p), "worker %s: start", name)
	return w
}

// stop closes the coordinator (handing its splits back) and its store.
func (w *soloWorker) stop() {
	w.once.Do(func() {
		_ = w.c.Close()
		_ = w.store.Close()
	})
}

// poll takes the worker's events; the worker failing fails the test.
func (w *soloWorker) poll() {
	w.e.t.Helper()
	evs, err := w.c.Poll()
	require.NoError(w.e.t, err, "worker %s failed", w.name)
	for _, ev := range evs {
		switch ev := ev.(type) {
		case spate.Gained:
			if _, again := w.gained[ev.Split.ID.String()]; again {
				w.regains = append(w.regains, ev)
			} else {
				w.gained[ev.Split.ID.String()] = ev
			}
		case spate.Lost:
			w.lost = append(w.lost, ev.Split.String())
		}
	}
}

// wait blocks until the worker wakes its waker or a poll tick passes.
func (w *soloWorker) wait() {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-w.waker.C():
	case <-t.C:
	}
}

func (w *soloWorker) lease() time.Duration { return w.c.Config().LeaseDuration }

// waitHolding polls until the worker has gained n splits.
func (w *soloWorker) waitHolding(n int) {
	w.e.t.Helper()
	deadline := time.Now().Add(10 * w.lease())
	for w.poll(); len(w.gained) < n; w.poll() {
		if time.Now().After(deadline) {
			w.e.t.Fatalf("waited 10 leases for worker %s to hold %d splits; it holds %d", w.name, n, len(w.gained))
		}
		w.wait()
	}
}

// pollFor polls for d: time for losses the load hid to surface.
func (w *soloWorker) pollFor(d time.Duration) {
	w.e.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); w.wait() {
		w.poll()
	}
	w.poll()
}

// laneStats counts the lanes' commits.
type laneStats struct {
	mu       sync.Mutex
	commits  int
	failures int
	first    []string    // the first few failures
	failed   []laneError // every failure
}

// laneError is one failed commit: when it ran and what it returned.
type laneError struct {
	id  spate.SplitID
	sp  span
	err error
}

func (s *laneStats) add(id spate.SplitID, sp span, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.commits++
		return
	}
	s.failures++
	s.failed = append(s.failed, laneError{id, sp, err})
	if len(s.first) < 3 {
		s.first = append(s.first, fmt.Sprintf("%s: %v", id, err))
	}
}

// excuse takes out of the failures every commit that ran out of its op
// timeout (Retryable, the deadline exceeded) while the witness saw the
// store itself stall: that commit's time went to the store, not to the
// coordinator. It returns how many it took out; every other failure
// stays.
func (s *laneStats) excuse(wit *witness) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kept []laneError
	for _, f := range s.failed {
		if !(spate.IsRetryable(f.err) && errors.Is(f.err, context.DeadlineExceeded) && wit.stalled(f.sp)) {
			kept = append(kept, f)
		}
	}
	excused := len(s.failed) - len(kept)
	s.failed, s.failures, s.first = kept, len(kept), nil
	for _, f := range kept[:min(3, len(kept))] {
		s.first = append(s.first, fmt.Sprintf("%s: %v", f.id, f.err))
	}
	return excused
}

// runLanes commits every gained split from a goroutine of its own for d,
// with strictly increasing watermarks, pausing between commits as pace
// gives each lane (0: back to back), while the test goroutine polls. A
// failed commit is counted, and retried after lease/100: a lane spinning
// on an error returned at once would freeze virtual time.
func (w *soloWorker) runLanes(d time.Duration, pace func(lane int) func() time.Duration) *laneStats {
	ctx, cancel := context.WithTimeout(w.e.ctx, d)
	defer cancel()
	st := &laneStats{}
	var wg sync.WaitGroup
	for i, id := range sortedKeys(w.gained) {
		g := w.gained[id]
		wm := int64(0)
		if g.Progress != nil {
			wm = g.Progress.Watermark
		}
		next := pace(i)
		backoff := w.lease() / 100
		wg.Go(func() {
			for {
				if p := next(); p > 0 && !sleepCtx(ctx, p) {
					return
				}
				if ctx.Err() != nil {
					return
				}
				wm++
				// The commit itself runs on the test's context: the end of
				// the load must not cut a commit short.
				start := time.Now()
				err := w.c.Commit(w.e.ctx, g.Split.ID, spate.NewSplitProgress(wm, []byte(fmt.Sprintf("state@%d", wm))))
				st.add(g.Split.ID, span{start, time.Now()}, err)
				if err != nil && (spate.IsFatal(err) || !sleepCtx(ctx, backoff)) {
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		w.poll()
		select {
		case <-done:
			w.poll()
			return st
		default:
		}
		w.wait()
	}
}

// sleepCtx sleeps for d; it reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// checkStarvation is every starvation scenario's verdict on a worker that
// held n splits under load: no Lost (keepRule), no failed commit
// (commitRule), and the store still shows every split owned and leased by
// it at the epoch it gained it, with no attempt charged (keepRule).
func (w *soloWorker) checkStarvation(raw spate.Store, n int, st *laneStats, keepRule, commitRule string) {
	e := w.e
	assert.Zerof(e.t, len(w.lost), "%s; the worker holding %d splits reported %d Lost: %s", keepRule, n, len(w.lost), firstFew(w.lost))
	assert.Zerof(e.t, st.failures, "%s; %d of %d commits failed, first: %s",
		commitRule, st.failures, st.commits+st.failures, firstFew(st.first))
	w.checkKept(raw, keepRule)
}

// checkKept checks in the store, through raw, that the worker still owns
// and leases every split it gained, at the epoch it first gained it, with
// no delivery attempt charged.
func (w *soloWorker) checkKept(raw spate.Store, rule string) {
	t := w.e.t
	t.Helper()
	js, err := spate.InspectJob(w.e.ctx, raw, "")
	require.NoError(t, err, "inspect")
	var bad []string
	for _, id := range sortedKeys(w.gained) {
		g := w.gained[id]
		s, ok := js.Split(id)
		switch {
		case !ok:
			bad = append(bad, id+" missing")
		case s.Owner != w.name || s.LeaseOwner != w.name || s.Epoch != g.Epoch || s.Attempts != 0:
			bad = append(bad, fmt.Sprintf("%v (gained at epoch %d)", s, g.Epoch))
		}
	}
	assert.Zerof(t, len(bad), "%s; want every split owned and leased by %s at the epoch it gained it, with 0 attempts; %d of %d are not: %s",
		rule, w.name, len(bad), len(w.gained), firstFew(bad))
}

// firstFew renders the first three of ss and how many more there are.
func firstFew(ss []string) string {
	if len(ss) <= 3 {
		return fmt.Sprint(ss)
	}
	return fmt.Sprintf("%v and %d more", ss[:3], len(ss)-3)
}
