package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// twoSplits is a job of two splits.
type twoSplits struct{}

func (twoSplits) Fingerprint() string { return "deleted-bucket:v1" }
func (twoSplits) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var splits []spate.PlannedSplit
	for i := range 2 {
		splits = append(splits, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("db-%d", i)), []byte("x"))))
	}
	return spate.NewSplitPlan(splits, spate.PlanFinal), nil
}

// TestCoordinatorStopsWhenItsBucketIsDeleted: a worker whose durable bucket
// is deleted mid-job stops with a Fatal error that says so, rather than
// running on against a store that no longer holds its job. At the
// product's defaults it stopped 17 to 23 s after the deletion in measured
// runs: the watch breaks when its guard finds the consumer gone (or
// nats.go gives up re-making it), and the re-watch is refused Fatal. (With the wait for a persisting answer
// kept per call, an op timeout shorter than it made every call Retryable
// and the worker ran on; this test caught that.)
func TestCoordinatorStopsWhenItsBucketIsDeleted(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	// The product's defaults.
	s := open(t, nc, spatenats.Options{Job: job, TTL: spate.DefaultLeaseDuration})
	cfg := spate.Config{InstanceID: "w"}
	c, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	waker := spate.NewWaker()
	c.SetWaker(waker)
	require.NoError(t, c.Start(twoSplits{}))
	held := 0
	for deadline := time.Now().Add(30 * time.Second); held < 2; {
		require.True(t, time.Now().Before(deadline), "the worker never held its splits")
		select {
		case <-waker.C():
		case <-time.After(50 * time.Millisecond):
		}
		evs, err := c.Poll()
		require.NoError(t, err)
		for _, ev := range evs {
			if _, ok := ev.(spate.Gained); ok {
				held++
			}
		}
	}

	js, streams := jobStreams(t, nc, job)
	require.NoError(t, js.DeleteStream(testCtx(t, 10*time.Second), streams[0]))
	deleted := time.Now()

	var failure error
	for failure == nil {
		require.Less(t, time.Since(deleted), time.Minute, "the worker still runs a minute after its bucket was deleted")
		select {
		case <-waker.C():
		case <-time.After(100 * time.Millisecond):
		}
		_, failure = c.Poll()
	}
	t.Logf("stopped %v after the deletion: %v", time.Since(deleted).Round(time.Millisecond), failure)
	require.ErrorIs(t, failure, spate.ErrFatal)
	require.ErrorContains(t, failure, "deleted")
}
