package spate_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/promtest"
	"github.com/spate-go/spate/stores/mem"
)

const testLease = 1500 * time.Millisecond

func testCfg(id string) spate.Config {
	return spate.Config{InstanceID: id, LeaseDuration: testLease, OpTimeout: 300 * time.Millisecond,
		ReplanInterval: testLease, ReconcileInterval: 300 * time.Millisecond, DrainDeadline: 5 * testLease,
		RebalanceDelay: spate.NoRebalanceDelay}
}

// tw is a minimal source driving one coordinator in tests.
type tw struct {
	t      *testing.T
	c      *spate.StoreCoordinator
	reg    *prometheus.Registry
	held   map[spate.SplitID]bool
	drains map[spate.SplitID]time.Time // revoked splits and when to finish
	drain  time.Duration               // how long a drain takes
	events []spate.Event
}

func startTW(t *testing.T, s spate.Store, id string, p spate.SplitPlanner, log *slog.Logger) *tw {
	t.Helper()
	return startTWWith(t, s, testCfg(id), p, log)
}

func startTWWith(t *testing.T, s spate.Store, cfg spate.Config, p spate.SplitPlanner, log *slog.Logger) *tw {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := []spate.CoordinatorOption{spate.WithRegisterer(reg)}
	if log != nil {
		opts = append(opts, spate.WithLogger(log))
	}
	c, err := spate.NewStoreCoordinator(s, cfg, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(p))
	t.Cleanup(func() { c.Close() })
	return &tw{t: t, c: c, reg: reg, held: map[spate.SplitID]bool{}, drains: map[spate.SplitID]time.Time{}}
}

func (w *tw) pump() {
	evs, err := w.c.Poll()
	require.NoError(w.t, err, "poll")
	for _, ev := range evs {
		w.events = append(w.events, ev)
		switch e := ev.(type) {
		case spate.Gained:
			w.held[e.Split.ID] = true
		case spate.Lost:
			delete(w.held, e.Split)
		case spate.RevokeRequested:
			if w.held[e.Split] {
				w.drains[e.Split] = time.Now().Add(w.drain)
			}
		}
	}
	for id, at := range w.drains {
		if time.Now().After(at) {
			if err := w.c.Commit(context.Background(), id, spate.NewSplitProgress(1, nil)); err == nil {
				_ = w.c.ReleaseDrained(context.Background(), id)
			}
			delete(w.held, id)
			delete(w.drains, id)
		}
	}
}

func pumpUntil(t *testing.T, d time.Duration, what string, cond func() bool, ws ...*tw) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "timed out waiting for "+what)
		}
		for _, w := range ws {
			w.pump()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, ok, err := promtest.Value(reg, name, labels...)
	require.NoError(t, err)
	if !ok {
		return -1
	}
	return v
}

func histSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return -1
}

// A real cooperative revocation moves the revocation counters, the draining
// gauge and drain duration on the releasing side, and an assignment latency
// covering the drain on the gaining side.
func TestRevocationMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		p := plan("metric", 4)
		a := startTW(t, s, "a", p, nil)
		pumpUntil(t, 20*testLease, "a holding everything", func() bool { return len(a.held) == 4 }, a)
		const floor = 2 * time.Second
		a.drain = floor
		b := startTW(t, s, "b", p, nil)
		pumpUntil(t, 5*testLease, "a draining", func() bool {
			return metric(t, a.reg, "spate_coordination_splits_draining") > 0
		}, a, b)
		pumpUntil(t, 10*testLease, "b holding half", func() bool { return len(b.held) == 2 }, a, b)
		assert.Equal(t, 2.0, metric(t, a.reg, "spate_coordination_revocations_total", "outcome", "requested"), "requested")
		assert.Equal(t, 2.0, metric(t, a.reg, "spate_coordination_revocations_total", "outcome", "drained"), "drained")
		assert.Equal(t, 2.0, metric(t, a.reg, "spate_coordination_drain_duration_seconds"), "drain durations observed")
		assert.Zero(t, metric(t, a.reg, "spate_coordination_splits_draining"), "draining gauge after the drains")
		n := metric(t, b.reg, "spate_coordination_assignment_latency_seconds")
		sum := histSum(t, b.reg, "spate_coordination_assignment_latency_seconds")
		assert.GreaterOrEqual(t, n, 2.0, "assignment latency must cover the drain (>= %v): %v samples, sum %v", floor/2, n, sum)
		assert.GreaterOrEqual(t, sum/n, floor.Seconds()/2, "assignment latency must cover the drain (>= %v): %v samples, sum %v", floor/2, n, sum)
		assert.Equal(t, 2.0, metric(t, b.reg, "spate_coordination_acquisitions_total", "reason", "reassigned"), "b's reassigned acquisitions")
		assert.Equal(t, 2.0, metric(t, a.reg, "spate_coordination_splits_owned"), "a's owned gauge")
		for _, name := range []string{"spate_coordination_revocations_total", "spate_coordination_drain_duration_seconds"} {
			problems, err := testutil.GatherAndLint(a.reg, name)
			assert.NoError(t, err, "metric lint %s", name)
			assert.Empty(t, problems, "metric lint %s", name)
		}
	})
}

// A cancelled revocation counts "cancelled" and keeps the draining gauge up
// until its drain lands.
func TestCancelledRevocationMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		p := plan("cancel", 4)
		a := startTW(t, s, "a", p, nil)
		pumpUntil(t, 20*testLease, "a holding everything", func() bool { return len(a.held) == 4 }, a)
		a.drain = time.Hour // the drain does not finish
		b := startTW(t, s, "b", p, nil)
		pumpUntil(t, 5*testLease, "a revocation", func() bool { return len(a.drains) > 0 }, a, b)
		b.c.Close() // the joiner leaves: the leader names everything for a again
		pumpUntil(t, 5*testLease, "the cancellation", func() bool {
			return metric(t, a.reg, "spate_coordination_revocations_total", "outcome", "cancelled") > 0
		}, a)
		assert.NotZero(t, metric(t, a.reg, "spate_coordination_splits_draining"), "the draining gauge must count a cancelled drain still in progress")
		assert.Zero(t, metric(t, a.reg, "spate_coordination_revocations_total", "outcome", "forced"), "a cancelled revocation must not be forced")
	})
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Operators read the logs: a peer join is announced, the rebalance line says
// what moved, completions alone publish nothing at INFO, and the joiner's
// probe delete is not reported as an external deletion.
func TestOperatorLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		var logA syncBuf
		p := plan("logs", 4)
		a := startTW(t, s, "a", p, slog.New(slog.NewTextHandler(&logA, &slog.HandlerOptions{Level: slog.LevelInfo})))
		pumpUntil(t, 20*testLease, "a holding everything", func() bool { return len(a.held) == 4 }, a)
		b := startTW(t, s, "b", p, nil)
		pumpUntil(t, 10*testLease, "b holding half", func() bool { return len(b.held) == 2 }, a, b)
		out := logA.String()
		assert.Contains(t, out, `msg="peer joined" instance=a peer=b live=2`, "no peer-joined line")
		assert.Contains(t, out, `msg="assignment published"`, "no rebalance line with moved=2")
		assert.Contains(t, out, "moved=2", "no rebalance line with moved=2")
		assert.NotContains(t, out, "deleted externally", "the joiner's probe delete was reported as an external deletion")
		before := strings.Count(logA.String(), "assignment published")
		// Complete alternately, so the loads never differ by a whole split
		// and no completion makes a move worth a rebalance.
		for len(a.held)+len(b.held) > 0 {
			for _, w := range []*tw{a, b} {
				for id := range w.held {
					require.NoError(t, w.c.Commit(context.Background(), id, spate.CompletedProgress(1, nil)))
					delete(w.held, id)
					break
				}
				time.Sleep(testLease)
				a.pump()
				b.pump()
			}
		}
		pumpUntil(t, 10*testLease, "AllComplete", func() bool {
			for _, ev := range a.events {
				if _, ok := ev.(spate.AllComplete); ok {
					return true
				}
			}
			return false
		}, a, b)
		after := strings.Count(logA.String(), "assignment published")
		assert.Equal(t, before, after, "completions alone must not log a rebalance at INFO (%d -> %d lines)", before, after)
	})
}

func plan(prefix string, n int) spate.SplitPlanner {
	var s []spate.PlannedSplit
	for i := range n {
		s = append(s, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("%s-%d", prefix, i)), nil)))
	}
	return fixedPlanner{fp: "test:" + prefix, plan: spate.NewSplitPlan(s, spate.PlanFinal)}
}

type fixedPlanner struct {
	fp   string
	plan spate.SplitPlan
}

func (p fixedPlanner) Fingerprint() string { return p.fp }
func (p fixedPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	return p.plan, nil
}

// Close racing a Release is safe (run it with -race): both hand splits back
// directly once the actor is gone, one at a time, and every split ends
// unowned.
func TestCloseRacingReleaseIsSafe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		a := startTW(t, s, "a", plan("race", 4), nil)
		pumpUntil(t, 20*testLease, "a holding everything", func() bool { return len(a.held) == 4 }, a)
		var ids []spate.SplitID
		for id := range a.held {
			ids = append(ids, id)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = a.c.Release(context.Background(), ids...) })
		wg.Go(func() { _ = a.c.Close() })
		wg.Wait()
		js, err := spate.InspectJob(context.Background(), s, "")
		require.NoError(t, err)
		for _, sp := range js.Splits {
			assert.Empty(t, sp.Owner, "split %s still owned after Close raced Release", sp.ID)
		}
	})
}

// stuckPlanner ignores its context until released.
type stuckPlanner struct{ release chan struct{} }

func (p stuckPlanner) Fingerprint() string { return "stuck" }
func (p stuckPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	<-p.release
	return spate.SplitPlan{}, nil
}

// Close waits for a planner that ignores its cancelled context only for a
// bounded time (the op timeout), then leaves it behind.
func TestCloseDoesNotWaitForAStuckPlanner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		p := stuckPlanner{release: make(chan struct{})}
		defer close(p.release)
		cfg := testCfg("stuck")
		c, err := spate.NewStoreCoordinator(s, cfg)
		require.NoError(t, err)
		require.NoError(t, c.Start(p))
		time.Sleep(testLease) // elected, planning, stuck
		start := time.Now()
		require.NoError(t, c.Close())
		took := time.Since(start)
		assert.LessOrEqual(t, took, 3*cfg.OpTimeout, "Close waited %v for a planner that ignores its context", took)
	})
}

// A fixed fleet of 5 workers holding 200 weighted splits, none of which
// completes: once every split is placed on all five (a member that joins
// late makes a legitimate rebalance first), nothing changes hands for 20
// leases: no gain, no revocation, no loss. Measured on the liveness issue: one
// split changed hands 5 to 50 times with nobody joining or leaving.
func TestFixedFleetOf5x200HandsNothingOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		var splits []spate.PlannedSplit
		for i := range 200 {
			spec := spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("fleet-%03d", i)), nil).WithWeight(uint64(1 + (i*7919)%97))
			splits = append(splits, spate.NewPlannedSplit(spec))
		}
		p := fixedPlanner{fp: "test:fleet", plan: spate.NewSplitPlan(splits, spate.PlanFinal)}
		quiet := slog.New(slog.DiscardHandler)
		var ws []*tw
		for i := range 5 {
			cfg := testCfg(fmt.Sprintf("w%d", i))
			cfg.MaxInFlight = 64
			ws = append(ws, startTWWith(t, s, cfg, p, quiet))
		}
		held := func() int {
			n := 0
			for _, w := range ws {
				n += len(w.held)
			}
			return n
		}
		// The first placement: every member present and holding, every
		// split held, no drain under way; then a lease more for moves in
		// flight to land.
		pumpUntil(t, 40*testLease, "every split placed on all five", func() bool {
			for _, w := range ws {
				if len(w.held) == 0 || len(w.drains) > 0 {
					return false
				}
			}
			return held() == 200
		}, ws...)
		settle := time.Now().Add(testLease)
		pumpUntil(t, 2*testLease, "a lease after the placement", func() bool { return !time.Now().Before(settle) }, ws...)
		before := make([]int, len(ws))
		for i, w := range ws {
			before[i] = len(w.events)
		}
		deadline := time.Now().Add(20 * testLease)
		for time.Now().Before(deadline) {
			for _, w := range ws {
				w.pump()
			}
			time.Sleep(10 * time.Millisecond)
		}
		var moves []string
		for i, w := range ws {
			for _, ev := range w.events[before[i]:] {
				switch ev.(type) {
				case spate.Gained, spate.RevokeRequested, spate.Lost:
					moves = append(moves, fmt.Sprintf("w%d %v", i, ev))
				}
			}
		}
		assert.Empty(t, moves, "a fixed fleet handed splits off after its first placement")
		assert.Equal(t, 200, held())
	})
}

// sessionSpy is a store with sessions whose sessions count their Close.
type sessionSpy struct {
	spate.Store
	mu     sync.Mutex
	opened int
	closed int
}

func (s *sessionSpy) NewSession(ctx context.Context) (spate.Session, error) {
	ss, err := s.Store.(spate.Sessioner).NewSession(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.opened++
	s.mu.Unlock()
	return &spySession{Session: ss, spy: s}, nil
}

func (s *sessionSpy) counts() (opened, closed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened, s.closed
}

type spySession struct {
	spate.Session
	spy  *sessionSpy
	once sync.Once
}

func (s *spySession) Close() error {
	s.once.Do(func() {
		s.spy.mu.Lock()
		s.spy.closed++
		s.spy.mu.Unlock()
	})
	return s.Session.Close()
}

// A graceful Close ends the lease session after the hand-back; Abandon,
// which stands for a death, leaves it to expire.
func TestCloseEndsTheLeaseSession(t *testing.T) {
	for _, graceful := range []bool{true, false} {
		t.Run(fmt.Sprintf("graceful=%t", graceful), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := mem.MustNew(mem.Options{TTL: testLease})
				defer s.Close()
				spy := &sessionSpy{Store: s}
				_, ok := spate.SessionerOf(spy)
				require.True(t, ok, "the spy has sessions")
				a := startTW(t, spy, "a", plan("sess", 3), nil)
				pumpUntil(t, 20*testLease, "a holding everything", func() bool { return len(a.held) == 3 }, a)
				opened, closed := spy.counts()
				require.Equal(t, 1, opened, "one session for the worker's leases")
				require.Zero(t, closed)
				if graceful {
					require.NoError(t, a.c.Close())
					_, closed = spy.counts()
					assert.Equal(t, 1, closed, "Close ends the session")
				} else {
					require.NoError(t, a.c.Abandon())
					_, closed = spy.counts()
					assert.Zero(t, closed, "Abandon leaves the session to expire")
				}
			})
		})
	}
}
