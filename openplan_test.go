package spate_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// growingPlanner is an open-ended job's planner: every run plans what the
// runs before it did and 4 new splits, Open, until its last run turns the
// plan Final.
type growingPlanner struct {
	mu   sync.Mutex
	runs int
	last int
}

func (p *growingPlanner) Fingerprint() string { return "growing" }

func (p *growingPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs++
	n := min(p.runs, p.last)
	var ss []spate.PlannedSplit
	for r := 1; r <= n; r++ {
		for i := range 4 {
			ss = append(ss, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("g%02d-%d", r, i)), nil).WithWeight(10)))
		}
	}
	f := spate.PlanOpen
	if n == p.last {
		f = spate.PlanFinal
	}
	return spate.NewSplitPlan(ss, f).WithPlannerState([]byte(fmt.Sprint(n))), nil
}

// openWorker holds splits and completes each a while after gaining it,
// counting the completions that won.
type openWorker struct {
	id        string
	c         *spate.StoreCoordinator
	held      map[spate.SplitID]spate.LeaseEpoch
	gainedAt  map[spate.SplitID]time.Time
	finalized int
	complete  bool
	gone      bool
}

func (w *openWorker) pump(t *testing.T, won map[spate.SplitID]int) {
	if w.gone {
		return
	}
	evs, err := w.c.Poll()
	require.NoError(t, err, w.id)
	for _, ev := range evs {
		switch e := ev.(type) {
		case spate.Gained:
			w.held[e.Split.ID], w.gainedAt[e.Split.ID] = e.Epoch, time.Now()
		case spate.Lost:
			delete(w.held, e.Split)
		case spate.RevokeRequested:
			if ep, ok := w.held[e.Split]; ok {
				if w.c.CommitAt(context.Background(), e.Split, ep, spate.NewSplitProgress(1, nil)) == nil {
					_ = w.c.ReleaseDrained(context.Background(), e.Split)
				}
				delete(w.held, e.Split)
			}
		case spate.PlanFinalized:
			w.finalized++
		case spate.AllComplete:
			w.complete = true
		}
	}
	for id, ep := range w.held {
		if time.Since(w.gainedAt[id]) < 2*time.Second {
			continue
		}
		if w.c.CommitAt(context.Background(), id, ep, spate.CompletedProgress(10, nil)) == nil {
			won[id]++
		}
		delete(w.held, id)
	}
}

// An open plan that grows at every replan while workers join, leave
// gracefully and die, at the product's default timings (in a synctest
// bubble: the 60 s replans and 30 s leases pass in virtual time): every
// split of every generation is completed by exactly one winning commit,
// every live worker hears PlanFinalized once, and the job ends
// AllComplete.
func TestAnOpenPlanGrowsWhileWorkersJoinLeaveAndDie(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := spate.Config{}.WithDefaults()
		s := mem.MustNew(mem.Options{TTL: cfg.LeaseDuration})
		defer s.Close()
		p := &growingPlanner{last: 6}
		won := map[spate.SplitID]int{}
		start := func(id string) *openWorker {
			h, err := s.Connect()
			require.NoError(t, err)
			t.Cleanup(func() { _ = h.Close() })
			c := cfg
			c.InstanceID = id
			co, err := spate.NewStoreCoordinator(h, c, spate.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			require.NoError(t, co.Start(p))
			t.Cleanup(func() { _ = co.Close() })
			return &openWorker{id: id, c: co, held: map[spate.SplitID]spate.LeaseEpoch{}, gainedAt: map[spate.SplitID]time.Time{}}
		}
		ws := []*openWorker{start("a"), start("b")}
		begin := time.Now()
		joinedC, leftA, diedB, joinedD := false, false, false, false
		for {
			elapsed := time.Since(begin)
			switch {
			case !joinedC && elapsed > 90*time.Second:
				joinedC = true
				ws = append(ws, start("c"))
			case !leftA && elapsed > 150*time.Second:
				leftA = true
				require.NoError(t, ws[0].c.Close()) // a graceful leave: it hands its splits back
				ws[0].gone = true
			case !diedB && elapsed > 200*time.Second:
				diedB = true
				require.NoError(t, ws[1].c.Abandon()) // a death: its leases expire
				ws[1].gone = true
			case !joinedD && elapsed > 260*time.Second:
				joinedD = true
				ws = append(ws, start("d"))
			}
			done := joinedD
			for _, w := range ws {
				w.pump(t, won)
				done = done && (w.gone || w.complete)
			}
			if done {
				break
			}
			require.Less(t, elapsed, 30*time.Minute, "the job did not complete")
			time.Sleep(100 * time.Millisecond)
		}
		require.Equal(t, 24, len(won), "splits completed, of 6 generations of 4")
		for id, n := range won {
			assert.Equal(t, 1, n, "split %s completed by %d winning commits", id, n)
		}
		for _, w := range ws[2:] {
			assert.Equal(t, 1, w.finalized, "%s heard PlanFinalized %d times", w.id, w.finalized)
		}
		p.mu.Lock()
		runs := p.runs
		p.mu.Unlock()
		assert.GreaterOrEqual(t, runs, 6, "the plan grew at replans")
		t.Logf("24 splits over %d planner runs, completed in %v of virtual time", runs, time.Since(begin).Round(time.Second))
	})
}
