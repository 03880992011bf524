package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
)

// ChaosOptions tune [RunChaos].
type ChaosOptions struct {
	// Seeds is how many seeded scenarios to run (default 3). The
	// environment variable SPATE_CHAOS_SEEDS overrides it, and
	// SPATE_CHAOS_SEED=n runs the one seed n: a failing seed reproduces.
	Seeds int
	// FirstSeed is the first seed (default 1).
	FirstSeed uint64
	// Steps is the number of faults per scenario (default 10).
	Steps int
	// Server, if set, can break and mend the store itself (kill a cluster
	// member, restart the server); it is one more fault the schedule draws.
	Server *FailoverHooks
}

// ChaosSummary is what a chaos run found.
type ChaosSummary struct {
	Scenarios  int
	Faults     map[string]int
	Violations int
	Operations int // split-record operations checked for linearizability
}

func (s ChaosSummary) String() string {
	total := 0
	for _, n := range s.Faults {
		total += n
	}
	return fmt.Sprintf("%d scenarios, %d faults injected %v, %d split-record operations checked, %d violations",
		s.Scenarios, total, s.Faults, s.Operations, s.Violations)
}

// RunChaos runs randomized, seeded fault scenarios against the driver
// behind newHarness, the way etcd's robustness suite and Jepsen do: workers
// run a bounded job while faults are injected — partitions (zombie owners),
// lost replies, failed writes, latency, broken watches, crashes and
// restarts with the same or a new instance id, and store failures when
// Server is set — then everything heals and the job must complete. It
// records what clients saw and checks:
//
// The faults include an asymmetric partition (a worker that can neither
// watch, list nor renew, but whose commits still reach the store), which
// makes zombie commits that only the fence can stop.
//
//	(a) no work is lost: every split ends completed at its full watermark;
//	(b) no committed watermark regresses, across owners;
//	(c) no write by a non-owner is visible: per split record, the epoch
//	    never decreases and within an epoch the owner only stays or
//	    clears;
//	(d) the split records' history is linearizable (porcupine);
//	(e) duplicates come only from uncommitted tails: every tenancy resumes
//	    at or after the last commit acknowledged to an earlier tenancy and
//	    no later than the furthest one attempted.
//
// The summary is logged; a violation fails the test with its seed.
func RunChaos(t *testing.T, newHarness HarnessMaker, co ChaosOptions, opts ...Option) ChaosSummary {
	if co.Seeds == 0 {
		co.Seeds = 3
	}
	if co.FirstSeed == 0 {
		co.FirstSeed = 1
	}
	if co.Steps == 0 {
		co.Steps = 10
	}
	if n, err := strconv.Atoi(os.Getenv("SPATE_CHAOS_SEEDS")); err == nil && n > 0 {
		co.Seeds = n
	}
	seeds := make([]uint64, 0, co.Seeds)
	if s, err := strconv.ParseUint(os.Getenv("SPATE_CHAOS_SEED"), 10, 64); err == nil {
		seeds = append(seeds, s)
	} else {
		for i := range co.Seeds {
			seeds = append(seeds, co.FirstSeed+uint64(i))
		}
	}
	var seedNames []string
	for _, seed := range seeds {
		seedNames = append(seedNames, fmt.Sprintf("seed=%d", seed))
	}
	o, err := collect("Chaos", seedNames, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Seeds that break the (shared) server must not overlap.
	o.serial = co.Server != nil
	var mu sync.Mutex
	sum := ChaosSummary{Faults: map[string]int{}}
	t.Run("Chaos", func(t *testing.T) {
		for _, seed := range seeds {
			name := fmt.Sprintf("seed=%d", seed)
			run(t, o, name, newHarness, func(e *env) {
				faults, ops, violations := chaosScenario(e, seed, co, func(n int) {
					mu.Lock()
					sum.Violations += n
					mu.Unlock()
				})
				mu.Lock()
				defer mu.Unlock()
				sum.Scenarios++
				sum.Operations += ops
				sum.Violations += violations
				for k, v := range faults {
					sum.Faults[k] += v
				}
			})
		}
	})
	t.Logf("chaos summary: %v", sum)
	return sum
}

// recordingStore records every operation on durable split records, as the
// coordinator saw it, for the linearizability check.
type recordingStore struct {
	spate.Store
	h      *History
	client int
}

// Capabilities hides the Releaser capability, deliberately: the history
// records Updates and Deletes, so the coordinators under chaos release in
// two calls here (the store rules check the atomic call itself). The
// KeyWatcher capability is passed on: watches are not part of the history,
// and the chaos must reach workers that watch only their own keys. So is
// the Sessioner capability: sessions write ephemeral leases only, which
// the history does not hold.
func (r *recordingStore) Capabilities() spate.Capabilities {
	c := r.Store.Capabilities()
	c.UpdateAndDelete = false
	_, c.WatchKeys = spate.KeyWatcherOf(r.Store)
	_, c.Sessions = spate.SessionerOf(r.Store)
	return c
}

// NewSession passes the store's Sessioner capability on.
func (r *recordingStore) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := spate.SessionerOf(r.Store)
	if !ok {
		return nil, fmt.Errorf("conformance: the store has no Sessioner capability: %w", spate.ErrFatal)
	}
	return sr.NewSession(ctx)
}

// WatchKeys passes the store's KeyWatcher capability on.
func (r *recordingStore) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(r.Store)
	if !ok {
		return nil, fmt.Errorf("conformance: the store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	return kw.WatchKeys(ctx, ks, keys)
}

func splitKey(ks spate.Keyspace, key string) bool {
	return ks == spate.Durable && strings.HasPrefix(key, "split.")
}

func (r *recordingStore) Create(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
	if !splitKey(ks, key) {
		return r.Store.Create(ctx, ks, key, v)
	}
	return Recorder{H: r.h, Client: r.client, Store: r.Store}.Create(ctx, ks, key, v)
}

func (r *recordingStore) Update(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
	if !splitKey(ks, key) {
		return r.Store.Update(ctx, ks, key, v, exp)
	}
	return Recorder{H: r.h, Client: r.client, Store: r.Store}.Update(ctx, ks, key, v, exp)
}

func (r *recordingStore) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	if !splitKey(ks, key) {
		return r.Store.Get(ctx, ks, key)
	}
	return Recorder{H: r.h, Client: r.client, Store: r.Store}.Get(ctx, ks, key)
}

func (r *recordingStore) Delete(ctx context.Context, ks spate.Keyspace, key string, exp uint64) (spate.Outcome, error) {
	if !splitKey(ks, key) {
		return r.Store.Delete(ctx, ks, key, exp)
	}
	return Recorder{H: r.h, Client: r.client, Store: r.Store}.Delete(ctx, ks, key, exp)
}

// splitVersion is one observed version of a split record.
type splitVersion struct {
	Epoch     uint64  `json:"epoch"`
	Owner     *string `json:"owner"`
	Watermark *int64  `json:"watermark"`
	Status    string  `json:"status"`
	rev       uint64
}

// RecordObserver watches a job's split records from the side and checks,
// on the sequence of versions it sees, that no write by a non-owner is
// visible (per record, the epoch never decreases and within an epoch the
// owner only stays or clears) and that committed watermarks never regress.
// Process-level fault tests use it on the real store.
type RecordObserver struct{ ob observer }

// NewRecordObserver returns an observer; start it with Watch.
func NewRecordObserver() *RecordObserver {
	return &RecordObserver{ob: observer{last: map[string]splitVersion{}}}
}

// Watch follows s's split records until ctx ends, re-watching after breaks.
func (r *RecordObserver) Watch(ctx context.Context, s spate.Store) { r.ob.watch(ctx, s) }

// Violations returns what the observer found so far.
func (r *RecordObserver) Violations() []string {
	r.ob.mu.Lock()
	defer r.ob.mu.Unlock()
	return slices.Clone(r.ob.violations)
}

// Versions is how many record versions the observer saw.
func (r *RecordObserver) Versions() int {
	r.ob.mu.Lock()
	defer r.ob.mu.Unlock()
	return r.ob.versions
}

// observer watches every split record and checks rule (c) and (b) on the
// sequence of versions it sees.
type observer struct {
	mu         sync.Mutex
	last       map[string]splitVersion
	violations []string
	versions   int
}

func (ob *observer) see(key string, value []byte, rev uint64) {
	var v splitVersion
	if json.Unmarshal(value, &v) != nil {
		return
	}
	v.rev = rev
	ob.mu.Lock()
	defer ob.mu.Unlock()
	prev, ok := ob.last[key]
	if ok && rev <= prev.rev {
		return
	}
	ob.last[key] = v
	ob.versions++
	if !ok {
		return
	}
	owner := func(p *string) string {
		if p == nil {
			return "<none>"
		}
		return *p
	}
	switch {
	case v.Epoch < prev.Epoch:
		ob.violations = append(ob.violations, fmt.Sprintf("(c) %s: epoch went back %d -> %d at revision %d", key, prev.Epoch, v.Epoch, rev))
	case v.Epoch == prev.Epoch && prev.Owner != nil && v.Owner != nil && *prev.Owner != *v.Owner:
		ob.violations = append(ob.violations, fmt.Sprintf("(c) %s: owner changed %s -> %s within epoch %d at revision %d: a non-owner's write landed",
			key, owner(prev.Owner), owner(v.Owner), v.Epoch, rev))
	case v.Epoch == prev.Epoch && prev.Owner == nil && v.Owner != nil:
		ob.violations = append(ob.violations, fmt.Sprintf("(c) %s: %s wrote epoch %d after its owner had cleared it (revision %d)",
			key, owner(v.Owner), v.Epoch, rev))
	}
	if prev.Watermark != nil && (v.Watermark == nil || *v.Watermark < *prev.Watermark) {
		ob.violations = append(ob.violations, fmt.Sprintf("(b) %s: committed watermark went back from %d at revision %d",
			key, *prev.Watermark, rev))
	}
}

// watch follows the durable split records until ctx ends, re-watching
// after breaks.
func (ob *observer) watch(ctx context.Context, s spate.Store) {
	for ctx.Err() == nil {
		ch, err := s.Watch(ctx, spate.Durable, "split.")
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for ev := range ch {
			if ev.Kind == spate.WatchPut {
				ob.see(ev.Key, ev.Value, ev.Revision)
			}
		}
	}
}

// chaosScenario runs one seed and returns the faults it injected, the
// operations it checked and the violations it found (after reporting them).
func chaosScenario(e *env, seed uint64, co ChaosOptions, addViolations func(int)) (map[string]int, int, int) {
	cr := &chaosRun{e: e, co: co, rng: rand.New(rand.NewPCG(seed, 0x5ba7e)), hist: &History{},
		ob: &observer{last: map[string]splitVersion{}}, faults: map[string]int{}, gen: 3}
	cr.f = newFleet(e, planOf(fmt.Sprintf("chaos%d", seed), 8))
	obsStore := e.open()
	octx, stopObs := context.WithCancel(e.ctx)
	var obsWG sync.WaitGroup
	obsWG.Go(func() { cr.ob.watch(octx, obsStore) })
	defer func() { stopObs(); obsWG.Wait() }()

	cr.workers = []*worker{cr.start("w0", "w0"), cr.start("w1", "w1"), cr.start("w2", "w2")}
	cr.f.until(20*leases(cr.f), "the first claims", func() bool {
		held := 0
		for _, w := range cr.workers {
			held += len(w.held)
		}
		return held > 0
	})
	for range co.Steps {
		cr.inject()
	}
	records := cr.heal()
	violations := cr.violations(records)
	// (d) linearizability of the split records: checked after the
	// scenario, outside any synctest bubble, so its timeout is real time.
	e.after = append(e.after, func(t testing.TB) {
		ok, info := cr.hist.Check(2 * time.Minute)
		if info != "" && ok {
			t.Logf("seed %d: linearizability check inconclusive: %s", seed, info)
		}
		if !ok {
			t.Errorf("seed %d: (d) %s (reproduce with SPATE_CHAOS_SEED=%d)", seed, info, seed)
			addViolations(1)
		}
	})
	for _, v := range violations {
		e.t.Errorf("seed %d: %s (reproduce with SPATE_CHAOS_SEED=%d)", seed, v, seed)
	}
	return cr.faults, cr.hist.Len(), len(violations)
}

// chaosEndless is the length of every split while faults are injected:
// splits never finish then. Once everything has healed, every worker gets
// the same finite length, past anything attempted so far.
const chaosEndless = int64(1) << 40

// chaosRun is one seed's scenario. Its phases: start three workers, inject
// co.Steps faults (inject), heal and run to AllComplete (heal), and check
// what the run left (violations).
type chaosRun struct {
	e    *env
	co   ChaosOptions
	rng  *rand.Rand
	f    *fleet
	hist *History  // every client's split-record operations
	ob   *observer // the sequence of split-record versions

	workers    []*worker // every worker started, dead ones included
	gen        int       // the next worker's number
	clients    int       // the store clients recorded so far
	serverDown bool      // co.Server is failed and not yet healed
	faults     map[string]int
}

// start starts a worker on its own recorded client, with the product's
// attempt budget (MaxAttempts default): store faults end tenancies often,
// and must never quarantine a split that progresses.
func (cr *chaosRun) start(name, id string) *worker {
	record := func(s spate.Store) spate.Store {
		cr.clients++
		return &recordingStore{Store: s, h: cr.hist, client: cr.clients}
	}
	w := cr.f.startPausedWith(name, record, withID(id), withRecords(chaosEndless),
		withRevoke([]revokePolicy{revokeAccept, revokeDecline, revokeAccept}[cr.rng.IntN(3)]))
	cr.f.launch(w)
	return w
}

func (cr *chaosRun) live() []*worker {
	var out []*worker
	for _, w := range cr.workers {
		if !w.dead {
			out = append(out, w)
		}
	}
	return out
}

// inject injects one fault, chosen by the seed, on a live worker (or the
// server), lets the fleet run a while, and may heal the server.
func (cr *chaosRun) inject() {
	f, rng := cr.f, cr.rng
	ws := cr.live()
	w := ws[rng.IntN(len(ws))]
	d := time.Duration(float64(leases(f)) * (0.2 + 1.3*rng.Float64()))
	kinds := []string{"partition", "asymmetric-partition", "lost-replies", "failed-writes", "latency", "broken-watches", "crash-restart", "crash-replace"}
	if cr.co.Server != nil {
		kinds = append(kinds, "server")
	}
	kind := kinds[rng.IntN(len(kinds))]
	cr.faults[kind]++
	switch kind {
	case "partition": // longer than a lease: the owner is a zombie
		w.inj.Partition()
		f.hold(d, "partitioned", func() bool { return true })
		w.inj.Heal()
	case "asymmetric-partition":
		// The worker cannot watch, list or renew, but its other writes
		// get through: its leases lapse and peers take its splits while
		// it still believes it owns them. Only the fence stops it.
		d = leases(f) + d
		r1 := w.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Watch, faultstore.List}})
		r2 := w.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update, faultstore.Create}, Keyspace: spate.Ephemeral})
		w.inj.BreakWatches()
		f.hold(d, "blind", func() bool { return true })
		r1()
		r2()
	case "lost-replies":
		w.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update, faultstore.Create}, Landed: true, Times: 1 + rng.IntN(4)})
	case "failed-writes":
		w.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update, faultstore.Create, faultstore.Delete}, Times: 1 + rng.IntN(4)})
	case "latency":
		remove := w.inj.Add(faultstore.Rule{Delay: time.Duration(float64(f.cfg.OpTimeout) * (0.2 + rng.Float64()))})
		f.hold(d, "slow", func() bool { return true })
		remove()
	case "broken-watches":
		w.inj.BreakWatches()
	case "crash-restart", "crash-replace":
		if len(ws) < 2 {
			cr.faults[kind]--
			return
		}
		if cr.serverDown { // a new worker could not even start
			cr.co.Server.Heal(cr.e.t)
			cr.serverDown = false
		}
		w.kill()
		id := w.id
		if kind == "crash-replace" {
			id = fmt.Sprintf("w%d", cr.gen)
		}
		cr.workers = append(cr.workers, cr.start(fmt.Sprintf("w%d", cr.gen), id))
		cr.gen++
	case "server":
		if !cr.serverDown {
			cr.co.Server.Fail(cr.e.t)
			cr.serverDown = cr.co.Server.Heal != nil
		}
	}
	f.hold(time.Duration(float64(leases(f))*0.5*rng.Float64()), "running", func() bool { return true })
	if cr.serverDown && rng.IntN(2) == 0 {
		cr.co.Server.Heal(cr.e.t)
		cr.serverDown = false
	}
}

// heal clears every fault, gives every live worker the same finite split
// length past anything attempted, and waits for AllComplete on each. It
// returns that length.
func (cr *chaosRun) heal() int64 {
	f := cr.f
	if cr.serverDown {
		cr.co.Server.Heal(cr.e.t)
	}
	records := int64(0)
	f.mu.Lock()
	for _, as := range f.attempts {
		for _, a := range as {
			records = max(records, a.watermark)
		}
	}
	f.mu.Unlock()
	records += 50
	for _, w := range cr.live() {
		w.inj.Clear()
		w.inj.Heal()
		w.records, w.perTick = records, 5
	}
	f.until(80*leases(f), "AllComplete on every live worker after healing", func() bool {
		for _, w := range cr.live() {
			if !w.saw(isAllComplete) {
				return false
			}
		}
		return true
	})
	return records
}

// violations checks what the run left, but (d) linearizability, which
// chaosScenario checks after the scenario.
func (cr *chaosRun) violations(records int64) []string {
	f := cr.f
	var violations []string
	// (a) every split completed at its full watermark.
	js := inspect(cr.e, cr.e.open())
	for _, s := range js.Splits {
		if s.Status != spate.StatusCompleted || s.Progress == nil || s.Progress.Watermark != records {
			violations = append(violations, fmt.Sprintf("(a) split %v did not end completed at watermark %d", s, records))
		}
	}
	// (b) and the epoch order of acknowledged commits.
	f.mu.Lock()
	for id, cs := range f.commits {
		for i := 1; i < len(cs); i++ {
			if cs[i].watermark < cs[i-1].watermark {
				violations = append(violations, fmt.Sprintf("(b) split %s: acknowledged watermark %d after %d", id, cs[i].watermark, cs[i-1].watermark))
			}
		}
	}
	f.mu.Unlock()
	// (c) from the observer's sequence of versions.
	cr.ob.mu.Lock()
	violations = append(violations, cr.ob.violations...)
	cr.ob.mu.Unlock()
	// (e) each tenancy resumed between the last acknowledged commit and the
	// furthest attempted one of the tenancies before it.
	for _, w := range cr.workers {
		for _, g := range w.gains {
			lo, hi := f.resumeBounds(g.Split.ID.String(), g.Epoch, w)
			got := int64(-1)
			if g.Progress != nil {
				got = g.Progress.Watermark
			}
			if got < lo || got > hi {
				violations = append(violations, fmt.Sprintf("(e) %s gained %s at epoch %d resuming from %d, outside [%d, %d]",
					w.name, g.Split.ID, g.Epoch, got, lo, hi))
			}
		}
	}
	return violations
}
