package spate_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// An empty store is "no job" — a sentinel a caller can tell from a broken
// job, since a new job's first worker may be writing its plan right now.
func TestInspectJobOnAnEmptyStoreIsErrNoJob(t *testing.T) {
	s := mem.MustNew(mem.Options{TTL: time.Second})
	defer s.Close()
	_, err := spate.InspectJob(t.Context(), s, "")
	require.ErrorIs(t, err, spate.ErrNoJob, "InspectJob on an empty store: want ErrNoJob (Fatal)")
	require.True(t, spate.IsFatal(err), "InspectJob on an empty store: %v, want ErrNoJob (Fatal)", err)
	_, err = s.Create(t.Context(), spate.Durable, "plan", []byte(`{"alien":true}`))
	require.NoError(t, err)
	_, err = spate.InspectJob(t.Context(), s, "")
	require.NotErrorIs(t, err, spate.ErrNoJob, "InspectJob on an alien plan: want a Fatal error that is not ErrNoJob")
	require.True(t, spate.IsFatal(err), "InspectJob on an alien plan: %v, want a Fatal error that is not ErrNoJob", err)
}

// LiveWorkers lists the workers present in a job, before any plan is
// readable too, and forgets one that leaves.
func TestLiveWorkersListsPresentWorkers(t *testing.T) {
	s := mem.MustNew(mem.Options{TTL: 2 * time.Second})
	defer s.Close()
	ids, err := spate.LiveWorkers(t.Context(), s)
	require.NoError(t, err, "LiveWorkers on an empty store")
	require.Empty(t, ids, "LiveWorkers on an empty store: want none")
	cfg := spate.TimingsForLease(2 * time.Second)
	cfg.InstanceID = "w-1"
	c, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	c.SetWaker(spate.InertWaker())
	require.NoError(t, c.Start(rangePlanner{}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids, err = spate.LiveWorkers(t.Context(), s)
		require.NoError(t, err)
		if slices.Equal(ids, []string{"w-1"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LiveWorkers = %v, want [w-1]", ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, c.Close())
	ids, err = spate.LiveWorkers(t.Context(), s)
	require.NoError(t, err, "LiveWorkers after the worker left")
	require.Empty(t, ids, "LiveWorkers after the worker left: want none")
}
