package spate_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// triggeredPlanner is a growingPlanner that can ask for a run.
type triggeredPlanner struct {
	growingPlanner
	asks chan struct{}
	ctx  context.Context // the context PlanTriggers was given
}

func (p *triggeredPlanner) PlanTriggers(ctx context.Context) <-chan struct{} {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
	return p.asks
}

func (p *triggeredPlanner) runCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs
}

// A planner that implements spate.PlanTrigger is run by the leader as
// soon as it asks, not at the next replan interval (an hour here, in the
// bubble's virtual time); the context it was given ends when the
// coordinator closes.
func TestPlanTriggerRunsThePlannerAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := spate.Config{}.WithDefaults()
		cfg.InstanceID = "a"
		cfg.ReplanInterval = time.Hour
		s := mem.MustNew(mem.Options{TTL: cfg.LeaseDuration})
		defer s.Close()
		p := &triggeredPlanner{growingPlanner: growingPlanner{last: 100}, asks: make(chan struct{}, 1)}
		co, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		require.NoError(t, co.Start(p))
		waitRuns := func(n int) {
			for deadline := time.Now().Add(time.Minute); p.runCount() < n; {
				require.True(t, time.Now().Before(deadline), "the planner ran %d times, want %d, within a minute (the replan interval is an hour)", p.runCount(), n)
				_, err := co.Poll()
				require.NoError(t, err)
				time.Sleep(10 * time.Millisecond)
			}
		}
		waitRuns(1)
		for n := 2; n <= 4; n++ {
			p.asks <- struct{}{}
			waitRuns(n)
		}
		p.mu.Lock()
		ctx := p.ctx
		p.mu.Unlock()
		require.NotNil(t, ctx)
		require.NoError(t, ctx.Err())
		require.NoError(t, co.Close())
		synctest.Wait()
		require.Error(t, ctx.Err(), "the triggers' context outlived the coordinator")
	})
}
