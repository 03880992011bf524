package conformance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
)

// RunBenchmarks measures, on the driver behind newHarness and in one run,
// what coordination costs against the store's own compare-and-swap:
//
//   - StoreUpdate: a raw compare-and-swap through the spate.Store
//     interface (the floor);
//   - FencedCommit: a fenced commit through the coordinator (handle, actor,
//     one compare-and-swap, reply);
//   - ReleaseReclaim: one split handed back and claimed again (lease delete,
//     owner clear, lease create, epoch-bumping compare-and-swap, and the
//     watch round trip that triggers the claim);
//   - Takeover: an owner dies without handing back; the time until a
//     standby gains its split, reported as takeover-s and as a multiple of
//     the lease (takeover/lease). Each iteration costs about a lease;
//   - CommitThroughput: commits per second (commits/s) from n goroutines,
//     each committing its own split, for n = 1, 4, 16 and 64: through one
//     coordinator holding the n splits (coordinator/N=n), and as raw
//     compare-and-swaps on n keys through one store client (raw/N=n), so
//     that the two sit side by side in one run. b.N is the total number of
//     commits, spread evenly over the goroutines; use a fixed count
//     (-benchtime 2000x) so a slow driver's run stays within a lease.
//
// Compare FencedCommit with StoreUpdate for the overhead spate adds, and
// with the driver's own raw-client benchmark for the driver's.
func RunBenchmarks(b *testing.B, newHarness HarnessMaker) {
	b.Run("StoreUpdate", func(b *testing.B) { benchStoreUpdate(b, newHarness) })
	b.Run("FencedCommit", func(b *testing.B) { benchFencedCommit(b, newHarness) })
	b.Run("ReleaseReclaim", func(b *testing.B) { benchReleaseReclaim(b, newHarness) })
	b.Run("Takeover", func(b *testing.B) { benchTakeover(b, newHarness) })
	b.Run("CommitThroughput", func(b *testing.B) { benchCommitThroughput(b, newHarness) })
}

// benchStore opens one store over a fresh harness, closed with b.
func benchStore(b *testing.B, mk HarnessMaker) spate.Store {
	h := mk(b)
	b.Cleanup(func() { closeHarness(b, h) })
	s, err := h.NewStore(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func benchStoreUpdate(b *testing.B, mk HarnessMaker) {
	ctx := context.Background()
	s := benchStore(b, mk)
	o, err := s.Create(ctx, spate.Durable, "bench.cas", []byte("0"))
	if err != nil || !o.Won {
		b.Fatalf("create: %v", err)
	}
	rev := o.Revision
	i := 0
	for b.Loop() {
		i++
		o, err := s.Update(ctx, spate.Durable, "bench.cas", fmt.Appendf(nil, `{"watermark":%d}`, i), rev)
		if err != nil || !o.Won {
			b.Fatalf("update: won=%t err=%v", o.Won, err)
		}
		rev = o.Revision
	}
}

// benchWorker starts one coordinator over a fresh harness store and waits
// until it holds n splits.
func benchWorker(b *testing.B, h Harness, n int) (*spate.StoreCoordinator, spate.Waker, []spate.SplitID) {
	ctx := context.Background()
	s, err := h.NewStore(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	cfg := testConfig(s.Capabilities().TTL)
	cfg.InstanceID = "bench"
	cfg.MaxInFlight = max(cfg.MaxInFlight, n)
	cfg.OpTimeout = min(cfg.LeaseDuration/2, 5*time.Second)
	cfg.DrainDeadline = max(cfg.DrainDeadline, cfg.OpTimeout)
	c, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(testLogger("bench")))
	if err != nil {
		b.Fatal(err)
	}
	w := spate.NewWaker()
	c.SetWaker(w)
	if err := c.Start(planOf("bench", n)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var held []spate.SplitID
	deadline := time.Now().Add(30 * cfg.LeaseDuration)
	for len(held) < n {
		if time.Now().After(deadline) {
			b.Fatalf("the worker never held its %d splits", n)
		}
		select {
		case <-w.C():
		case <-time.After(50 * time.Millisecond):
		}
		evs, err := c.Poll()
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range evs {
			if g, ok := ev.(spate.Gained); ok {
				held = append(held, g.Split.ID)
			}
		}
	}
	return c, w, held
}

func benchFencedCommit(b *testing.B, mk HarnessMaker) {
	h := mk(b)
	defer closeHarness(b, h)
	c, _, held := benchWorker(b, h, 1)
	ctx := context.Background()
	var wm int64
	for b.Loop() {
		wm++
		if err := c.Commit(ctx, held[0], spate.NewSplitProgress(wm, nil)); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
}

func benchReleaseReclaim(b *testing.B, mk HarnessMaker) {
	h := mk(b)
	defer closeHarness(b, h)
	// Two splits, so handing one back is never the worker's departure.
	c, w, held := benchWorker(b, h, 2)
	ctx := context.Background()
	id := held[0]
	for b.Loop() {
		if err := c.ReleaseDrained(ctx, id); err != nil {
			b.Fatalf("release: %v", err)
		}
		for gained := false; !gained; {
			select {
			case <-w.C():
			case <-time.After(time.Second):
			}
			evs, err := c.Poll()
			if err != nil {
				b.Fatal(err)
			}
			for _, ev := range evs {
				if g, ok := ev.(spate.Gained); ok && g.Split.ID == id {
					gained = true
				}
			}
		}
	}
}

// benchTakeover measures failover: owner death to another worker's Gained.
func benchTakeover(b *testing.B, mk HarnessMaker) {
	var total, lease time.Duration
	for i := 0; i < b.N; i++ {
		h := mk(b)
		ownerC, _, _ := benchWorker(b, h, 1)
		lease = ownerC.Config().LeaseDuration
		// The standby: same job, nothing to hold until the owner dies.
		ctx := context.Background()
		s, err := h.NewStore(ctx)
		if err != nil {
			b.Fatal(err)
		}
		cfg := ownerC.Config()
		cfg.InstanceID = "standby"
		sb, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(testLogger("standby")))
		if err != nil {
			b.Fatal(err)
		}
		w := spate.NewWaker()
		sb.SetWaker(w)
		if err := sb.Start(planOf("bench", 1)); err != nil {
			b.Fatal(err)
		}
		// Let the standby join, then kill the owner: nothing is handed back.
		time.Sleep(lease / 3)
		died := time.Now()
		ownerC.Abandon()
		for gained := false; !gained; {
			if time.Since(died) > 20*lease {
				b.Fatalf("no takeover within 20 leases")
			}
			select {
			case <-w.C():
			case <-time.After(50 * time.Millisecond):
			}
			evs, err := sb.Poll()
			if err != nil {
				b.Fatal(err)
			}
			for _, ev := range evs {
				if _, ok := ev.(spate.Gained); ok {
					gained = true
				}
			}
		}
		total += time.Since(died)
		sb.Close()
		s.Close()
		closeHarness(b, h)
	}
	avg := total / time.Duration(b.N)
	b.ReportMetric(avg.Seconds(), "takeover-s")
	b.ReportMetric(float64(avg)/float64(lease), "takeover/lease")
}

// commitThroughputLanes are the goroutine counts of CommitThroughput.
var commitThroughputLanes = []int{1, 4, 16, 64}

func benchCommitThroughput(b *testing.B, mk HarnessMaker) {
	b.Run("coordinator", func(b *testing.B) {
		for _, n := range commitThroughputLanes {
			b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchCoordinatorCommits(b, mk, n) })
		}
	})
	b.Run("raw", func(b *testing.B) {
		for _, n := range commitThroughputLanes {
			b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchRawCommits(b, mk, n) })
		}
	})
}

// spreadCommits runs total commits over n goroutines, goroutine i calling
// commit(i, k) for k = 1, 2, ... its share, timed from the first to the
// last, and reports commits/s. The first error stops the benchmark.
func spreadCommits(b *testing.B, n, total int, commit func(lane int, k int64) error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	b.ResetTimer()
	for i := range n {
		share := total / n
		if i < total%n {
			share++
		}
		wg.Go(func() {
			for k := 1; k <= share; k++ {
				if err := commit(i, int64(k)); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("goroutine %d, commit %d: %w", i, k, err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if first != nil {
		b.Fatal(first)
	}
	b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "commits/s")
}

// benchCoordinatorCommits: n goroutines commit, each its own split, through
// one coordinator holding the n splits.
func benchCoordinatorCommits(b *testing.B, mk HarnessMaker, n int) {
	h := mk(b)
	defer closeHarness(b, h)
	c, _, held := benchWorker(b, h, n)
	ctx := context.Background()
	spreadCommits(b, n, b.N, func(lane int, k int64) error {
		return c.Commit(ctx, held[lane], spate.NewSplitProgress(k, nil))
	})
}

// benchRawCommits: n goroutines compare-and-swap, each its own key, through
// one shared store client. One client, not n, because a coordinator has
// one: the ratio to coordinator/N=n is then what the coordinator's own
// structure costs, not a difference in connections.
func benchRawCommits(b *testing.B, mk HarnessMaker, n int) {
	ctx := context.Background()
	s := benchStore(b, mk)
	revs := make([]uint64, n)
	keys := make([]string, n) // formatted once: the baseline's loop does only the CAS
	for i := range n {
		keys[i] = fmt.Sprintf("bench.raw.%02d", i)
		o, err := s.Create(ctx, spate.Durable, keys[i], []byte(`{"watermark":0}`))
		if err != nil || !o.Won {
			b.Fatalf("create: won=%t err=%v", o.Won, err)
		}
		revs[i] = o.Revision
	}
	spreadCommits(b, n, b.N, func(lane int, k int64) error {
		o, err := s.Update(ctx, spate.Durable, keys[lane], fmt.Appendf(nil, `{"watermark":%d}`, k), revs[lane])
		if err != nil {
			return err
		}
		if !o.Won {
			return fmt.Errorf("update of %s at revision %d lost", keys[lane], revs[lane])
		}
		revs[lane] = o.Revision
		return nil
	})
}
