package spate_test

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// An empty store is "no job" — a sentinel a caller can tell from a broken
// job, since a new job's first worker may be writing its plan right now.
func TestInspectJobOnAnEmptyStoreIsErrNoJob(t *testing.T) {
	s := mem.MustNew(mem.Options{TTL: time.Second})
	defer s.Close()
	_, err := spate.InspectJob(t.Context(), s, "")
	if !errors.Is(err, spate.ErrNoJob) || !spate.IsFatal(err) {
		t.Fatalf("InspectJob on an empty store: %v, want ErrNoJob (Fatal)", err)
	}
	if _, err := s.Create(t.Context(), spate.Durable, "plan", []byte(`{"alien":true}`)); err != nil {
		t.Fatal(err)
	}
	_, err = spate.InspectJob(t.Context(), s, "")
	if errors.Is(err, spate.ErrNoJob) || !spate.IsFatal(err) {
		t.Fatalf("InspectJob on an alien plan: %v, want a Fatal error that is not ErrNoJob", err)
	}
}

// LiveWorkers lists the workers present in a job, before any plan is
// readable too, and forgets one that leaves.
func TestLiveWorkersListsPresentWorkers(t *testing.T) {
	s := mem.MustNew(mem.Options{TTL: 2 * time.Second})
	defer s.Close()
	ids, err := spate.LiveWorkers(t.Context(), s)
	if err != nil || len(ids) != 0 {
		t.Fatalf("LiveWorkers on an empty store: %v, %v; want none", ids, err)
	}
	cfg := spate.TimingsForLease(2 * time.Second)
	cfg.InstanceID = "w-1"
	c, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	c.SetWaker(spate.InertWaker())
	if err := c.Start(rangePlanner{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids, err = spate.LiveWorkers(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(ids, []string{"w-1"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LiveWorkers = %v, want [w-1]", ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ids, err = spate.LiveWorkers(t.Context(), s)
	if err != nil || len(ids) != 0 {
		t.Fatalf("LiveWorkers after the worker left: %v, %v; want none", ids, err)
	}
}
