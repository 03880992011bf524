package spate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

func TestSplitIDValidation(t *testing.T) {
	for _, ok := range []string{"rows-000000-000125", "A_z9", "x", strings.Repeat("x", spate.SplitIDMaxLen)} {
		id, err := spate.NewSplitID(ok)
		assert.NoError(t, err, "NewSplitID(%q): %v", ok, err)
		assert.Equal(t, ok, id.String(), "NewSplitID(%q).String() = %q", ok, id)
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "å", "a\x00", strings.Repeat("x", spate.SplitIDMaxLen+1)} {
		_, err := spate.NewSplitID(bad)
		if !assert.Error(t, err, "NewSplitID(%q) accepted an invalid id", bad) {
			continue
		}
		assert.True(t, spate.IsFatal(err), "NewSplitID(%q): error %v, want Fatal", bad, err)
		assert.ErrorIs(t, err, spate.ErrFatal, "NewSplitID(%q): error %v, want Fatal", bad, err)
	}
	var zero spate.SplitID
	assert.True(t, zero.IsZero(), "zero SplitID should report IsZero")
}

func TestSplitIDText(t *testing.T) {
	var id spate.SplitID
	err := id.UnmarshalText([]byte("good-id"))
	require.NoError(t, err, "UnmarshalText: %v %q", err, id)
	require.Equal(t, "good-id", id.String(), "UnmarshalText: %v %q", err, id)
	err = id.UnmarshalText([]byte("bad.id"))
	require.True(t, spate.IsFatal(err), "UnmarshalText of an invalid id: %v", err)
	require.Equal(t, "good-id", id.String(), "a failed UnmarshalText changed the id to %q", id)
}

func TestErrorClasses(t *testing.T) {
	fenced := spate.Fencedf("split %s is owned by a peer at epoch %d", "s-0", 2)
	assert.True(t, spate.IsFenced(fenced))
	assert.True(t, errors.Is(fenced, spate.ErrFenced), "a fenced error matches ErrFenced")
	assert.False(t, errors.Is(fenced, spate.ErrFatal), "a fenced error matches ErrFenced only")
	assert.Contains(t, fenced.Error(), "owned by a peer", "error text keeps the reason")
	assert.True(t, spate.IsRetryable(spate.Retryablef("timeout")))
	assert.True(t, spate.IsFatal(spate.Fatalf("no CAS")))
	// class is the one predicate of the three that holds ("" for none).
	class := func(err error) string {
		var held []string
		for name, is := range map[string]func(error) bool{"fenced": spate.IsFenced, "retryable": spate.IsRetryable, "fatal": spate.IsFatal} {
			if is(err) {
				held = append(held, name)
			}
		}
		require.LessOrEqual(t, len(held), 1, "%v is %v at once", err, held)
		if len(held) == 0 {
			return ""
		}
		return held[0]
	}
	cases := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("etcd: put %q: %w: %w", "k", errors.New("io"), spate.ErrRetryable), "retryable"},
		{fmt.Errorf("nats: %w: %w", errors.New("bad creds"), spate.ErrFatal), "fatal"},
		{fmt.Errorf("wrapped: %w", spate.Fencedf("x")), "fenced"},
		{context.Canceled, "retryable"},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), "retryable"},
		{errors.New("unclassified"), "fatal"},
		{driver.ClosedError("mem"), "fatal"},
	}
	for _, c := range cases {
		got := class(c.err)
		assert.Equal(t, c.want, got, "class of %v = %q, want %q", c.err, got, c.want)
	}
	wrapped := spate.Retryablef("store unreachable: %w", context.DeadlineExceeded)
	assert.ErrorIs(t, wrapped, context.DeadlineExceeded, "a %%w cause must stay reachable: %v", wrapped)
	assert.ErrorIs(t, wrapped, spate.ErrRetryable, "a %%w cause must stay reachable: %v", wrapped)
}

func TestBuildersCoverTheSeamTypes(t *testing.T) {
	spec := spate.NewSplitSpec(spate.MustSplitID("s"), []byte("d"))
	assert.Equal(t, uint64(1), spec.Weight, "default weight %d, want 1", spec.Weight)
	w := spec.WithWeight(64 << 20).Weight
	assert.Equal(t, uint64(64<<20), w, "WithWeight: %d", w)
	w = spec.WithWeight(0).EffectiveWeight()
	assert.Equal(t, uint64(1), w, "weight 0 is treated as 1, got %d", w)
	planned := spate.NewPlannedSplit(spec)
	assert.Nil(t, planned.Seed, "NewPlannedSplit has no seed")
	seeded := planned.WithSeed(spate.NewSplitProgress(7, []byte("state")))
	if assert.NotNil(t, seeded.Seed, "WithSeed: %+v (original %+v)", seeded.Seed, planned.Seed) {
		assert.Equal(t, int64(7), seeded.Seed.Watermark, "WithSeed: %+v (original %+v)", seeded.Seed, planned.Seed)
	}
	assert.Nil(t, planned.Seed, "WithSeed: %+v (original %+v)", seeded.Seed, planned.Seed)
	plan := spate.NewSplitPlan([]spate.PlannedSplit{seeded}, spate.PlanOpen)
	assert.Nil(t, plan.PlannerState, "NewSplitPlan keeps the previous cursor (nil)")
	st := plan.WithPlannerState([]byte("cursor")).PlannerState
	assert.Equal(t, "cursor", string(st), "WithPlannerState: %q", st)
	assert.NotNil(t, plan.WithPlannerState(nil).PlannerState, "WithPlannerState(nil) must store an empty cursor, not keep the old one")
	assert.False(t, spate.NewSplitProgress(7, nil).Completed, "progress builders set Completed wrongly")
	assert.True(t, spate.CompletedProgress(7, nil).Completed, "progress builders set Completed wrongly")
	assert.Equal(t, "open", spate.PlanOpen.String(), "finality names")
	assert.Equal(t, "final", spate.PlanFinal.String(), "finality names")
}

func TestLeaseEpochsOrderAcrossOwners(t *testing.T) {
	require.Greater(t, spate.LeaseEpoch(2), spate.LeaseEpoch(1), "epochs must order")
}

func TestWakerCoalescesAndNeverBlocks(t *testing.T) {
	w := spate.NewWaker()
	for range 100 {
		w.Wake() // must not block even though nobody receives
	}
	received := func() bool {
		select {
		case <-w.C():
			return true
		default:
			return false
		}
	}
	require.True(t, received(), "a wake must be buffered")
	require.False(t, received(), "a burst must coalesce into one wakeup")
	inert := spate.InertWaker()
	inert.Wake()
	var zero spate.Waker
	zero.Wake()
	require.Nil(t, inert.C(), "an inert waker has no channel")
}

func TestValidateKey(t *testing.T) {
	for _, ok := range []string{"plan", "split.abc-1", "_probe.x", "a.b.c"} {
		err := spate.ValidateKey(ok)
		assert.NoError(t, err, "ValidateKey(%q): %v", ok, err)
	}
	for _, bad := range []string{"", ".a", "a.", "a..b", "a b", "a/b", "a*", strings.Repeat("k", spate.KeyMaxLen+1)} {
		err := spate.ValidateKey(bad)
		assert.ErrorIs(t, err, spate.ErrInvalidKey, "ValidateKey(%q) = %v", bad, err)
		assert.True(t, spate.IsFatal(err), "ValidateKey(%q) = %v", bad, err)
	}
	for _, ok := range []string{"", "split.", "spl"} {
		err := spate.ValidatePrefix(ok)
		assert.NoError(t, err, "ValidatePrefix(%q): %v", ok, err)
	}
}
