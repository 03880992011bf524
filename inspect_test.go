package spate_test

import (
	"errors"
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
