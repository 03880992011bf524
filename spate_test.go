package spate_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
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

func TestBuildersCoverTheSeamTypes(t *testing.T) {
	spec := spate.NewSplitSpec(spate.MustSplitID("s"), []byte("d"))
	assert.Equal(t, uint64(1), spec.Weight, "default weight %d, want 1", spec.Weight)
	w := spec.WithWeight(64 << 20).Weight
	assert.Equal(t, uint64(64<<20), w, "WithWeight: %d", w)
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
