// Package scale measures what coordinators cost a store, over a store of
// a conformance harness. [Measure] runs a fleet of workers at the
// product's timings through placement, a steady-state window, a watch
// break on every worker and one worker's death; [MeasureLifecycle] counts
// the store calls of each step of one split's lifecycle (claim, takeover,
// commit, release) against [LifecycleGoals]. Every driver's tests run
// them (stores/mem's fleet in virtual time, the others' as benchmarks
// against a real server); docs/performance.md is made from their output.
//
// It is measurement, not a rule of the contract: the contract's rules are
// in package conformance.
package scale

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
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/internal/countstore"
	"github.com/spate-go/spate/conformance/internal/kit"
)

// Options shapes one fleet-scale measurement (see [Measure]).
type Options struct {
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

// Result is what [Measure] observed. Rates are per second of the
// clock the fleet ran on (virtual inside a synctest bubble).
type Result struct {
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
func (r Result) EventsPerWrite() float64 {
	if r.WritesPerSec == 0 {
		return 0
	}
	return r.EventsPerSec / r.WritesPerSec
}

// Header is the header of [Result.Row]'s table.
const Header = "| workers × splits | a worker watches | placed | first placement | writes/s | events/s | events per write | reads/s | re-read after a watch break (total; max, median worker; median worker's watched keys) | CPU core-s/s (total, per worker) | heap per worker | takeover | leases lost | quarantined |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// Row formats r as one markdown table row under [Header].
func (r Result) Row() string {
	return fmt.Sprintf("| %d × %d | %s | %d | %.1fs | %.0f | %.0f | %.2f | %.0f | %d; %d, %d; %d | %.3f, %.4f | %.2f MB | %.1fs | %d | %d |",
		r.Workers, r.Splits, r.Watch, r.Placed, r.Placement.Seconds(), r.WritesPerSec, r.EventsPerSec, r.EventsPerWrite(),
		r.ReadsPerSec, r.ReadsAfterBreak, r.ReadsAfterBreakMax, r.ReadsAfterBreakMedian, r.OwnKeysMedian, r.CPUPerSec, r.CPUPerSec/float64(r.Workers), r.HeapPerWorker/1e6,
		r.Takeover.Seconds(), r.LeasesLost, r.Quarantined)
}

// Measure runs a fleet of o.Workers coordinators over one store of
// the harness, every one at the product's default timings for the store's
// TTL (spate.TimingsForLease) with a lane budget of twice its share of the
// job,
// each held split committing every o.CommitEvery. It measures placement,
// then the steady state for o.Window, then a simultaneous watch break on
// every worker, then one worker's death. Run it inside a synctest bubble
// for virtual time.
func Measure(t testing.TB, mk conformance.HarnessMaker, o Options) Result {
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
	defer kit.CloseHarness(t, h, "run")
	probe, err := h.NewStore(context.Background())
	if err != nil {
		t.Fatalf("scale: open a store: %v", err)
	}
	defer probe.Close()
	ttl := probe.Capabilities().TTL
	if o.Placement == 0 {
		o.Placement = 20 * ttl
	}
	r := &scaleRun{t: t, o: o, cfg: spate.TimingsForLease(ttl), cnt: countstore.NewCounters(),
		res: Result{Workers: o.Workers, Splits: o.Splits, Watch: "whole job"}}
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
	r.phase("takeover took %v; stopping the fleet\n%s\n%s", r.res.Takeover.Round(time.Millisecond), Header, r.res.Row())
	return r.res
}

// scaleRun is one Measure run. Its phases, in order: startFleet,
// place (until every split is held), measureWindow (the steady state),
// breakWatches (every watch at once), killOne (a worker's takeover).
type scaleRun struct {
	t     testing.TB
	o     Options
	cfg   spate.Config
	cnt   *countstore.Counters
	fleet []*scaleWorker
	start time.Time
	res   Result
}

func (r *scaleRun) phase(format string, args ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "scale W=%d S=%d: %s\n", r.o.Workers, r.o.Splits, fmt.Sprintf(format, args...))
	}
}

func (r *scaleRun) startFleet(h conformance.Harness) {
	r.phase("starting the fleet")
	planner := kit.PlanOf("scale", r.o.Splits)
	r.start = time.Now()
	r.fleet = make([]*scaleWorker, r.o.Workers)
	for i := range r.fleet {
		s, err := h.NewStore(context.Background())
		if err != nil {
			r.t.Fatalf("scale: open a store: %v", err)
		}
		c := r.cfg
		c.InstanceID = fmt.Sprintf("w%04d", i)
		cs := &countstore.Store{Store: s, C: r.cnt, WholeJob: r.o.WholeJob}
		coord, err := spate.NewStoreCoordinator(cs, c, spate.WithLogger(kit.Logger(c.InstanceID)))
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
	w0, e0, r0 := r.cnt.Writes.Load(), r.cnt.Events.Load(), r.cnt.Reads.Load()
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
	r.res.WritesPerSec = float64(r.cnt.Writes.Load()-w0) / secs
	r.res.EventsPerSec = float64(r.cnt.Events.Load()-e0) / secs
	r.res.ReadsPerSec = float64(r.cnt.Reads.Load()-r0) / secs
	r.res.HeapPerWorker = float64(liveHeap()-heap0) / float64(r.o.Workers)
}

// breakWatches is a store restart as every worker sees it: all watches
// break at once; it counts what the fleet re-reads within a lease.
func (r *scaleRun) breakWatches() {
	r.phase("breaking every watch")
	before := make([]int64, len(r.fleet))
	watched := make([]int64, len(r.fleet))
	for i, w := range r.fleet {
		before[i], watched[i] = w.cs.Rereads.Load(), w.cs.Watching.Load()
	}
	r.cnt.BreakAll()
	time.Sleep(r.cfg.LeaseDuration)
	per := make([]int64, len(r.fleet))
	for i, w := range r.fleet {
		per[i] = w.cs.Rereads.Load() - before[i]
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

// WriteTable writes results as a markdown table.
func WriteTable(w io.Writer, results []Result) {
	var b strings.Builder
	b.WriteString(Header + "\n")
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

// scaleWorker drives one coordinator like a source: it commits every held
// split every `every`, hands back what it is asked to, and counts what it
// lost.
type scaleWorker struct {
	c     *spate.StoreCoordinator
	cs    *countstore.Store
	st    spate.Store
	waker spate.Waker
	every time.Duration
	rng   *rand.Rand
	cnt   *countstore.Counters

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

// Bench runs [Measure] once, in real time, and reports its
// figures as benchmark metrics (use -benchtime 1x):
//
//	go test -run '^$' -bench 'Scale/workers=50$' -benchtime 1x ./stores/etcd
//
// BenchWatches runs Bench twice, as sub-benchmarks
// watch=whole (every worker watching the whole job: the baseline) and
// watch=keys (each worker its own keys, on a store with KeyWatcher), so
// that both come from one command on one machine.
func BenchWatches(b *testing.B, mk conformance.HarnessMaker, o Options) {
	for _, whole := range []bool{true, false} {
		name := "watch=keys"
		if whole {
			name = "watch=whole"
		}
		b.Run(name, func(b *testing.B) {
			o := o
			o.WholeJob = whole
			Bench(b, mk, o)
		})
	}
}

func Bench(b *testing.B, mk conformance.HarnessMaker, o Options) {
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	r := Measure(b, mk, o)
	b.Log(Header + "\n" + r.Row())
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
