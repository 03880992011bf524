package conformance

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spate-go/spate"
)

// ScaleOptions shapes one fleet-scale measurement (see [MeasureScale]).
type ScaleOptions struct {
	// Workers is the number of coordinators in the fleet. Required.
	Workers int
	// Splits is the job's size; 0 means 100 per worker.
	Splits int
	// CommitEvery is how often each held split commits; 0 means 2s.
	CommitEvery time.Duration
	// Window is how long the steady state is measured; 0 means 10s.
	Window time.Duration
	// Placement bounds the wait for every split to be held; 0 means 20
	// leases.
	Placement time.Duration
	// Progress, when set, receives a line as each phase starts (a real-time
	// run at a large W takes minutes).
	Progress io.Writer
	// WholeJob hides the store's KeyWatcher capability from the fleet, so
	// every worker watches the whole job, as on a store without it: the
	// baseline the scoped watch is measured against.
	WholeJob bool
	// OnWindow, when set, is called as the steady-state window starts
	// (true) and ends (false), for instance to profile it. Inside a
	// synctest bubble, start a CPU profile from a goroutine outside the
	// bubble: the profiler's own goroutine never blocks durably, so
	// started inside, it would stop virtual time.
	OnWindow func(start bool)
}

// ScaleResult is what [MeasureScale] observed. Rates are per second of the
// clock the fleet ran on (virtual inside a synctest bubble).
type ScaleResult struct {
	Workers, Splits int
	// Watch is what a non-leader watches: "keys" (its own, the store's
	// KeyWatcher) or "whole job".
	Watch string
	// Placement is the time from the fleet's start until every split was
	// held; Placed is how many were held when the wait ended.
	Placement time.Duration
	Placed    int
	// WritesPerSec counts every Create, Update and Delete call the fleet
	// made in the window; EventsPerSec every live watch event delivered to
	// a worker (snapshots excluded).
	WritesPerSec, EventsPerSec float64
	// ReadsPerSec counts entries read in the window: one per Get, one per
	// listed entry and one per watch-snapshot entry.
	ReadsPerSec float64
	// ReadsAfterBreak is the number of entries the fleet re-read because
	// every worker's watches broke at once (a store restart), within a
	// lease: counted exactly, as the snapshot entries of the first
	// re-opening of each prefix watch the break ended, and of each key
	// whose key watch it ended, the first time a snapshot holds that key
	// again (whatever group it is watched in then).
	// ReadsAfterBreakMax and ReadsAfterBreakMedian are one worker's: the
	// most any worker re-read (the leader's, when it watches the whole
	// job) and the median worker's. OwnKeysMedian is the median worker's
	// number of keys watched when the break came, for comparison.
	ReadsAfterBreak                           int64
	ReadsAfterBreakMax, ReadsAfterBreakMedian int64
	OwnKeysMedian                             int64
	// CPUPerSec is the process's CPU-seconds per second in the window
	// (the store's own work included when it runs in-process).
	CPUPerSec float64
	// HeapPerWorker is the live heap growth over the fleet's start,
	// divided by the number of workers.
	HeapPerWorker float64
	// Takeover is the time from one worker's death until its splits were
	// all held again (0 when they were not within 10 leases).
	Takeover time.Duration
	// LeasesLost counts Lost events of live workers over the whole run;
	// Quarantined counts splits quarantined (every split here is healthy).
	LeasesLost, Quarantined int64
}

// EventsPerWrite is watch events delivered per store write.
func (r ScaleResult) EventsPerWrite() float64 {
	if r.WritesPerSec == 0 {
		return 0
	}
	return r.EventsPerSec / r.WritesPerSec
}

// ScaleHeader is the header of [ScaleResult.Row]'s table.
const ScaleHeader = "| workers × splits | a worker watches | placed | first placement | writes/s | events/s | events per write | reads/s | re-read after a watch break (total; max, median worker; median worker's watched keys) | CPU core-s/s (total, per worker) | heap per worker | takeover | leases lost | quarantined |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// Row formats r as one markdown table row under [ScaleHeader].
func (r ScaleResult) Row() string {
	return fmt.Sprintf("| %d × %d | %s | %d | %.1fs | %.0f | %.0f | %.2f | %.0f | %d; %d, %d; %d | %.3f, %.4f | %.2f MB | %.1fs | %d | %d |",
		r.Workers, r.Splits, r.Watch, r.Placed, r.Placement.Seconds(), r.WritesPerSec, r.EventsPerSec, r.EventsPerWrite(),
		r.ReadsPerSec, r.ReadsAfterBreak, r.ReadsAfterBreakMax, r.ReadsAfterBreakMedian, r.OwnKeysMedian, r.CPUPerSec, r.CPUPerSec/float64(r.Workers), r.HeapPerWorker/1e6,
		r.Takeover.Seconds(), r.LeasesLost, r.Quarantined)
}

// MeasureScale runs a fleet of o.Workers coordinators over one store of
// the harness, every one at the product's default timings for the store's
// TTL (spate.TimingsForLease) with a lane budget of twice its share of the
// job,
// each held split committing every o.CommitEvery. It measures placement,
// then the steady state for o.Window, then a simultaneous watch break on
// every worker, then one worker's death. Run it inside a synctest bubble
// for virtual time.
func MeasureScale(t testing.TB, mk HarnessMaker, o ScaleOptions) ScaleResult {
	if o.Splits == 0 {
		o.Splits = 100 * o.Workers
	}
	if o.CommitEvery == 0 {
		o.CommitEvery = 2 * time.Second
	}
	if o.Window == 0 {
		o.Window = 10 * time.Second
	}
	h := mk(t)
	defer closeHarness(t, h)
	probe, err := h.NewStore(context.Background())
	if err != nil {
		t.Fatalf("scale: open a store: %v", err)
	}
	defer probe.Close()
	ttl := probe.Capabilities().TTL
	if o.Placement == 0 {
		o.Placement = 20 * ttl
	}
	r := &scaleRun{t: t, o: o, cfg: spate.TimingsForLease(ttl), cnt: &scaleCounters{brk: make(chan struct{})},
		res: ScaleResult{Workers: o.Workers, Splits: o.Splits, Watch: "whole job"}}
	// Lanes for twice a worker's share, so the survivors can take a dead
	// worker's splits.
	r.cfg.MaxInFlight = 2 * ((o.Splits + o.Workers - 1) / o.Workers)
	if _, ok := spate.KeyWatcherOf(probe); ok && !o.WholeJob {
		r.res.Watch = "keys"
	}
	heap0 := liveHeap()
	r.startFleet(h)
	defer r.stopFleet()
	r.place()
	r.measureWindow(heap0)
	r.breakWatches()
	r.killOne()
	r.phase("takeover took %v; stopping the fleet\n%s\n%s", r.res.Takeover.Round(time.Millisecond), ScaleHeader, r.res.Row())
	return r.res
}

// scaleRun is one MeasureScale run. Its phases, in order: startFleet,
// place (until every split is held), measureWindow (the steady state),
// breakWatches (every watch at once), killOne (a worker's takeover).
type scaleRun struct {
	t     testing.TB
	o     ScaleOptions
	cfg   spate.Config
	cnt   *scaleCounters
	fleet []*scaleWorker
	start time.Time
	res   ScaleResult
}

func (r *scaleRun) phase(format string, args ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "scale W=%d S=%d: %s\n", r.o.Workers, r.o.Splits, fmt.Sprintf(format, args...))
	}
}

func (r *scaleRun) startFleet(h Harness) {
	r.phase("starting the fleet")
	planner := planOf("scale", r.o.Splits)
	r.start = time.Now()
	r.fleet = make([]*scaleWorker, r.o.Workers)
	for i := range r.fleet {
		s, err := h.NewStore(context.Background())
		if err != nil {
			r.t.Fatalf("scale: open a store: %v", err)
		}
		c := r.cfg
		c.InstanceID = fmt.Sprintf("w%04d", i)
		cs := &countingStore{Store: s, c: r.cnt, wholeJob: r.o.WholeJob}
		coord, err := spate.NewStoreCoordinator(cs, c, spate.WithLogger(testLogger(c.InstanceID)))
		if err != nil {
			r.t.Fatalf("scale: %v", err)
		}
		w := &scaleWorker{c: coord, st: s, cs: cs, every: r.o.CommitEvery, held: map[spate.SplitID]*scaleSplit{},
			rng: rand.New(rand.NewPCG(uint64(i), 7)), stop: make(chan struct{}), done: make(chan struct{}), cnt: r.cnt}
		r.fleet[i] = w
		w.waker = spate.NewWaker()
		coord.SetWaker(w.waker)
		if err := coord.Start(planner); err != nil {
			r.t.Fatalf("scale: start: %v", err)
		}
		go w.run()
	}
}

// stopFleet closes every worker at once, as a fleet-wide SIGTERM: closed
// one by one, every Close handed its splits to the survivors, which
// claimed them only to hand them back in turn (minutes at W=50 on etcd).
func (r *scaleRun) stopFleet() {
	var wg sync.WaitGroup
	for _, w := range r.fleet {
		wg.Go(w.close)
	}
	wg.Wait()
}

func (r *scaleRun) held() int {
	n := 0
	for _, w := range r.fleet {
		n += int(w.nHeld.Load())
	}
	return n
}

// place waits until every split is held (at most o.Placement), then a
// lease for the first commits and the churn of placement to pass.
func (r *scaleRun) place() {
	for next := 5 * time.Second; r.held() < r.o.Splits && time.Since(r.start) < r.o.Placement; {
		time.Sleep(100 * time.Millisecond)
		if el := time.Since(r.start); el >= next {
			r.phase("placing: %d of %d splits held after %v", r.held(), r.o.Splits, el.Round(time.Second))
			next += 5 * time.Second
		}
	}
	r.res.Placement, r.res.Placed = time.Since(r.start), r.held()
	r.phase("%d of %d splits held after %v; settling for a lease", r.res.Placed, r.o.Splits, r.res.Placement.Round(time.Millisecond))
	if r.res.Placed < r.o.Splits {
		r.t.Logf("scale: only %d of %d splits held after %v", r.res.Placed, r.o.Splits, r.res.Placement)
	}
	time.Sleep(r.cfg.LeaseDuration)
}

// measureWindow measures the steady state for o.Window; heap0 is the live
// heap before the fleet started.
func (r *scaleRun) measureWindow(heap0 uint64) {
	r.phase("measuring for %v", r.o.Window)
	w0, e0, r0 := r.cnt.writes.Load(), r.cnt.events.Load(), r.cnt.reads.Load()
	if r.o.OnWindow != nil {
		r.o.OnWindow(true)
	}
	cpu0, t0 := cpuTime(), time.Now()
	time.Sleep(r.o.Window)
	if r.o.OnWindow != nil {
		r.o.OnWindow(false)
	}
	secs := time.Since(t0).Seconds()
	r.res.CPUPerSec = (cpuTime() - cpu0).Seconds() / secs
	r.res.WritesPerSec = float64(r.cnt.writes.Load()-w0) / secs
	r.res.EventsPerSec = float64(r.cnt.events.Load()-e0) / secs
	r.res.ReadsPerSec = float64(r.cnt.reads.Load()-r0) / secs
	r.res.HeapPerWorker = float64(liveHeap()-heap0) / float64(r.o.Workers)
}

// breakWatches is a store restart as every worker sees it: all watches
// break at once; it counts what the fleet re-reads within a lease.
func (r *scaleRun) breakWatches() {
	r.phase("breaking every watch")
	before := make([]int64, len(r.fleet))
	watched := make([]int64, len(r.fleet))
	for i, w := range r.fleet {
		before[i], watched[i] = w.cs.rereads.Load(), w.cs.watching.Load()
	}
	r.cnt.breakAll()
	time.Sleep(r.cfg.LeaseDuration)
	per := make([]int64, len(r.fleet))
	for i, w := range r.fleet {
		per[i] = w.cs.rereads.Load() - before[i]
		r.res.ReadsAfterBreak += per[i]
	}
	slices.Sort(per)
	slices.Sort(watched)
	r.res.ReadsAfterBreakMax, r.res.ReadsAfterBreakMedian = per[len(per)-1], per[len(per)/2]
	r.res.OwnKeysMedian = watched[len(watched)/2]
}

// killOne kills one worker without a hand-back and times the takeover
// (at most 10 leases), then totals the run's lost leases and quarantines.
func (r *scaleRun) killOne() {
	victim := r.fleet[len(r.fleet)-1]
	r.phase("killing one worker")
	victim.abandon()
	died := time.Now()
	for time.Since(died) < 10*r.cfg.LeaseDuration {
		if r.held() >= r.o.Splits {
			r.res.Takeover = time.Since(died)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, w := range r.fleet {
		r.res.LeasesLost += w.lost.Load()
		r.res.Quarantined += w.quarantined.Load()
	}
}

// WriteScaleTable writes results as a markdown table.
func WriteScaleTable(w io.Writer, results []ScaleResult) {
	var b strings.Builder
	b.WriteString(ScaleHeader + "\n")
	for _, r := range results {
		b.WriteString(r.Row() + "\n")
	}
	io.WriteString(w, b.String())
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scaleCounters are shared by every worker's countingStore.
type scaleCounters struct {
	writes, events, reads atomic.Int64
	mu                    sync.Mutex
	brk                   chan struct{} // closed to break every open watch
}

func (c *scaleCounters) breakAll() {
	c.mu.Lock()
	close(c.brk)
	c.brk = make(chan struct{})
	c.mu.Unlock()
}

func (c *scaleCounters) breaker() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.brk
}

// countingStore counts a worker's store traffic and can break its watches.
// With calls set it also logs every keyed call (MeasureLifecycle); with
// plain set it hides the Releaser capability.
type countingStore struct {
	spate.Store
	c        *scaleCounters
	reads    atomic.Int64 // this worker's reads
	rereads  atomic.Int64 // snapshot entries re-read because a break ended their watch
	watching atomic.Int64 // keys listed by this worker's open key watches
	wmu      sync.Mutex
	broken   [2]map[string]bool // by keyspace: prefixes whose watch a break ended, not yet re-opened
	lostKeys [2]map[string]bool // by keyspace: keys whose key watch a break ended, not yet re-read
	calls    *callLog
	plain    bool
	wholeJob bool // hide the KeyWatcher capability
}

func (s *countingStore) Create(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
	s.c.writes.Add(1)
	o, err := s.Store.Create(ctx, ks, key, v)
	s.calls.add("create", ks, key, o.Won, err)
	return o, err
}

func (s *countingStore) Update(ctx context.Context, ks spate.Keyspace, key string, v []byte, rev uint64) (spate.Outcome, error) {
	s.c.writes.Add(1)
	o, err := s.Store.Update(ctx, ks, key, v, rev)
	s.calls.add("update", ks, key, o.Won, err)
	return o, err
}

// read counts n entries read, for the fleet and for this worker.
func (s *countingStore) read(n int64) {
	s.c.reads.Add(n)
	s.reads.Add(n)
}

// Capabilities passes the Releaser capability on when the store has it
// (and plain is not set), and the KeyWatcher capability when the store
// has it (and wholeJob is not set).
func (s *countingStore) Capabilities() spate.Capabilities {
	c := s.Store.Capabilities()
	_, c.UpdateAndDelete = spate.ReleaserOf(s.Store)
	c.UpdateAndDelete = c.UpdateAndDelete && !s.plain
	_, c.WatchKeys = spate.KeyWatcherOf(s.Store)
	c.WatchKeys = c.WatchKeys && !s.wholeJob
	_, c.Sessions = spate.SessionerOf(s.Store)
	return c
}

// NewSession passes the Sessioner capability on when the store has it;
// the session's Create and Update count as writes, and so does its
// KeepAlive (one round trip that renews every bound key).
func (s *countingStore) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := spate.SessionerOf(s.Store)
	if !ok {
		return nil, fmt.Errorf("conformance: the store has no Sessioner capability: %w", spate.ErrFatal)
	}
	in, err := sr.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return &countingSession{Session: in, s: s}, nil
}

type countingSession struct {
	spate.Session
	s *countingStore
}

func (cs *countingSession) Create(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
	cs.s.c.writes.Add(1)
	o, err := cs.Session.Create(ctx, key, v)
	cs.s.calls.add("session-create", spate.Ephemeral, key, o.Won, err)
	return o, err
}

func (cs *countingSession) Update(ctx context.Context, key string, v []byte, rev uint64) (spate.Outcome, error) {
	cs.s.c.writes.Add(1)
	o, err := cs.Session.Update(ctx, key, v, rev)
	cs.s.calls.add("session-update", spate.Ephemeral, key, o.Won, err)
	return o, err
}

func (cs *countingSession) KeepAlive(ctx context.Context) error {
	cs.s.c.writes.Add(1)
	err := cs.Session.KeepAlive(ctx)
	cs.s.calls.add("keep-alive", spate.Ephemeral, "", err == nil, err)
	return err
}

// UpdateAndDelete counts one write: the release's one round trip.
func (s *countingStore) UpdateAndDelete(ctx context.Context, dk string, v []byte, rev uint64, ek string, leaseRev uint64) (spate.Outcome, spate.Outcome, error) {
	r, ok := spate.ReleaserOf(s.Store)
	if !ok || s.plain {
		return spate.Outcome{}, spate.Outcome{}, fmt.Errorf("conformance: the store has no Releaser capability: %w", spate.ErrFatal)
	}
	s.c.writes.Add(1)
	u, d, err := r.UpdateAndDelete(ctx, dk, v, rev, ek, leaseRev)
	s.calls.add("update-and-delete", spate.Durable, dk, u.Won && d.Won, err)
	return u, d, err
}

func (s *countingStore) Delete(ctx context.Context, ks spate.Keyspace, key string, rev uint64) (spate.Outcome, error) {
	s.c.writes.Add(1)
	o, err := s.Store.Delete(ctx, ks, key, rev)
	s.calls.add("delete", ks, key, o.Won, err)
	return o, err
}

func (s *countingStore) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	s.read(1)
	e, ok, err := s.Store.Get(ctx, ks, key)
	s.calls.add("get", ks, key, ok, err)
	return e, ok, err
}

func (s *countingStore) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	es, err := s.Store.List(ctx, ks, prefix)
	s.read(int64(max(len(es), 1)))
	return es, err
}

func (s *countingStore) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return s.count(ctx, ks, prefix, nil, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return s.Store.Watch(ctx, ks, prefix)
	})
}

// WatchKeys counts a key watch's traffic as Watch does.
func (s *countingStore) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(s.Store)
	if !ok || s.wholeJob {
		return nil, fmt.Errorf("conformance: the store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	return s.count(ctx, ks, "", keys, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return kw.WatchKeys(ctx, ks, keys)
	})
}

// opened records a watch of prefix in ks, or of keys (non-nil) in ks,
// and says whether it re-opens a prefix watch that a break ended.
func (s *countingStore) opened(ks spate.Keyspace, prefix string, keys []string) (reopen bool) {
	s.watching.Add(int64(len(keys)))
	if keys != nil {
		return false
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	reopen = s.broken[ks-1][prefix]
	delete(s.broken[ks-1], prefix)
	return reopen
}

// closed records the end of a watch opened as opened was told; broke says
// a break ended it: a prefix watch is then re-read when re-opened, a key
// watch's keys each when a later snapshot first holds it.
func (s *countingStore) closed(ks spate.Keyspace, prefix string, keys []string, broke bool) {
	s.watching.Add(-int64(len(keys)))
	if !broke {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.broken[ks-1] == nil {
		s.broken[ks-1], s.lostKeys[ks-1] = map[string]bool{}, map[string]bool{}
	}
	if keys == nil {
		s.broken[ks-1][prefix] = true
	}
	for _, k := range keys {
		s.lostKeys[ks-1][k] = true
	}
}

// reread says whether a snapshot entry of key in ks re-reads a key whose
// key watch a break ended (the first snapshot to hold it since).
func (s *countingStore) reread(ks spate.Keyspace, key string) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if !s.lostKeys[ks-1][key] {
		return false
	}
	delete(s.lostKeys[ks-1], key)
	return true
}

// count opens a stream with open and counts what it delivers: snapshot
// entries as reads, live puts and deletes as events. The stream watches
// prefix in ks, or keys (non-nil) in ks. A snapshot entry
// that re-reads what a break took away (a re-opened prefix watch's, or a
// key whose key watch broke) counts as a re-read too, whatever group the
// key is watched in now.
func (s *countingStore) count(ctx context.Context, ks spate.Keyspace, prefix string, keys []string, open func(context.Context) (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	wctx, cancel := context.WithCancel(ctx)
	in, err := open(wctx)
	if err != nil {
		cancel()
		return nil, err
	}
	brk := s.c.breaker()
	reopen := s.opened(ks, prefix, keys)
	out := make(chan spate.WatchEvent)
	go func() {
		broke := false
		defer func() { s.closed(ks, prefix, keys, broke) }()
		defer close(out)
		defer cancel()
		snap := true
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				switch {
				case ev.Kind == spate.WatchSnapshotDone:
					snap = false
				case snap && ev.Kind == spate.WatchPut:
					s.read(1)
					if reopen || keys != nil && s.reread(ks, ev.Key) {
						s.rereads.Add(1)
					}
				case !snap && (ev.Kind == spate.WatchPut || ev.Kind == spate.WatchDelete):
					s.c.events.Add(1)
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-brk:
				broke = true
				select {
				case out <- spate.WatchEvent{Kind: spate.WatchError, Err: spate.Retryablef("scale: simulated store restart")}:
				case <-ctx.Done():
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// scaleWorker drives one coordinator like a source: it commits every held
// split every `every`, hands back what it is asked to, and counts what it
// lost.
type scaleWorker struct {
	c     *spate.StoreCoordinator
	cs    *countingStore
	st    spate.Store
	waker spate.Waker
	every time.Duration
	rng   *rand.Rand
	cnt   *scaleCounters

	held              map[spate.SplitID]*scaleSplit
	nHeld             atomic.Int64
	lost, quarantined atomic.Int64
	stop, done        chan struct{}
	once              sync.Once
	abandoned         atomic.Bool
}

type scaleSplit struct {
	epoch spate.LeaseEpoch
	wm    int64
	due   time.Time
}

func (w *scaleWorker) run() {
	defer close(w.done)
	ctx := context.Background()
	// Each worker ticks at its own phase, as processes started apart do:
	// inside a synctest bubble, tickers started together fire at the same
	// instant, and every worker's due commits would land on the leader's
	// watch in one burst.
	select {
	case <-w.stop:
		return
	case <-time.After(time.Duration(w.rng.Int64N(int64(w.every / 10)))):
	}
	tick := time.NewTicker(w.every / 10)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.waker.C():
		case <-tick.C:
		}
		evs, err := w.c.Poll()
		if err != nil {
			return
		}
		now := time.Now()
		for _, ev := range evs {
			switch e := ev.(type) {
			case spate.Gained:
				wm := int64(0)
				if e.Progress != nil {
					wm = e.Progress.Watermark
				}
				w.held[e.Split.ID] = &scaleSplit{epoch: e.Epoch, wm: wm, due: now.Add(time.Duration(w.rng.Int64N(int64(w.every))))}
			case spate.Lost:
				if _, ok := w.held[e.Split]; ok {
					delete(w.held, e.Split)
					w.lost.Add(1)
				}
			case spate.RevokeRequested:
				if s, ok := w.held[e.Split]; ok {
					s.wm++
					_ = w.c.CommitAt(ctx, e.Split, s.epoch, spate.NewSplitProgress(s.wm, nil))
					_ = w.c.ReleaseDrained(ctx, e.Split)
					delete(w.held, e.Split)
				}
			case spate.Quarantined:
				w.quarantined.Add(1)
			}
		}
		for id, s := range w.held {
			select {
			case <-w.stop:
				return // a pass of commits on an overloaded store takes long
			default:
			}
			if now.Before(s.due) {
				continue
			}
			s.wm++
			s.due = s.due.Add(w.every)
			_ = w.c.CommitAt(ctx, id, s.epoch, spate.NewSplitProgress(s.wm, nil)) // a fenced one is followed by Lost
		}
		w.nHeld.Store(int64(len(w.held)))
	}
}

func (w *scaleWorker) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	w.nHeld.Store(0)
}

// abandon kills the worker without handing anything back.
func (w *scaleWorker) abandon() {
	w.abandoned.Store(true)
	w.halt()
	w.c.Abandon()
	w.st.Close()
}

func (w *scaleWorker) close() {
	w.halt()
	if !w.abandoned.Load() {
		w.c.Close()
		w.st.Close()
	}
}

// BenchScale runs [MeasureScale] once, in real time, and reports its
// figures as benchmark metrics (use -benchtime 1x):
//
//	go test -run '^$' -bench 'Scale/workers=50$' -benchtime 1x ./stores/etcd
//
// BenchScaleWatches runs BenchScale twice, as sub-benchmarks
// watch=whole (every worker watching the whole job: the baseline) and
// watch=keys (each worker its own keys, on a store with KeyWatcher), so
// that both come from one command on one machine.
func BenchScaleWatches(b *testing.B, mk HarnessMaker, o ScaleOptions) {
	for _, whole := range []bool{true, false} {
		name := "watch=keys"
		if whole {
			name = "watch=whole"
		}
		b.Run(name, func(b *testing.B) {
			o := o
			o.WholeJob = whole
			BenchScale(b, mk, o)
		})
	}
}

func BenchScale(b *testing.B, mk HarnessMaker, o ScaleOptions) {
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	r := MeasureScale(b, mk, o)
	b.Log(ScaleHeader + "\n" + r.Row())
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.WritesPerSec, "writes/s")
	b.ReportMetric(r.EventsPerSec, "events/s")
	b.ReportMetric(r.EventsPerWrite(), "events/write")
	b.ReportMetric(r.ReadsPerSec, "reads/s")
	b.ReportMetric(float64(r.ReadsAfterBreak), "reads-after-break")
	b.ReportMetric(float64(r.ReadsAfterBreakMedian), "reads-after-break/median-worker")
	b.ReportMetric(r.CPUPerSec/float64(r.Workers), "cpu-s/s/worker")
	b.ReportMetric(r.HeapPerWorker/1e6, "heap-MB/worker")
	b.ReportMetric(r.Placement.Seconds(), "placement-s")
	b.ReportMetric(r.Takeover.Seconds(), "takeover-s")
	b.ReportMetric(float64(r.LeasesLost), "leases-lost")
	b.ReportMetric(float64(r.Quarantined), "quarantined")
}
