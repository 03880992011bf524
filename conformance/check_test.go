package conformance_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/conformance"
)

// Skip names a rule of the suite it is passed to; anything else is refused
// before a rule runs, so a typo cannot skip nothing quietly.
func TestSkipRefusesUnknownRules(t *testing.T) {
	ran := 0
	count := conformance.OnResult(func(conformance.Result) { ran++ })
	err := conformance.CheckStore(t.Context(), mutantHarness(mutants, "none"),
		conformance.Skip("NoSuchRule", "a typo"), count)
	require.ErrorContains(t, err, `Skip("NoSuchRule")`)
	require.ErrorContains(t, err, "StoreRules")
	err = conformance.CheckCoordinator(t.Context(), mutantHarness(mutants, "none"),
		conformance.Skip(conformance.StoreRules[0].Name, "a store rule"), count)
	require.ErrorContains(t, err, "Coordinator has no rule of that name")
	require.Zero(t, ran, "rules ran although the options were refused")
}

// CheckStore runs without a testing.T: it reports every selected rule
// once, with its contract sentence, and returns nil when none failed.
func TestCheckStoreReportsEveryRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			results = map[string]conformance.Result{}
		)
		skipped := conformance.StoreRules[1].Name
		err := conformance.CheckStore(t.Context(), mutantHarness(mutants, "none-capped"), conformance.Parallel(8),
			conformance.Skip(skipped, "to see it reported"),
			conformance.OnResult(func(r conformance.Result) {
				mu.Lock()
				defer mu.Unlock()
				assert.NotContains(t, results, r.Rule, "reported twice")
				results[r.Rule] = r
			}))
		require.NoError(t, err)
		require.Len(t, results, len(conformance.StoreRules))
		for _, r := range conformance.StoreRules {
			res := results["Store/"+r.Name]
			assert.Equal(t, r.Contract, res.Contract, "%s", r.Name)
			want := conformance.Passed
			if r.Name == skipped {
				want = conformance.Skipped
				assert.Equal(t, []string{"to see it reported"}, res.Log)
			}
			assert.Equal(t, want, res.Status, "%s: %v", r.Name, res.Log)
		}
	})
}

// A broken rule comes back as a *RuleError naming it and its sentence, with
// the failure message; Select runs only the rules asked for.
func TestCheckStoreReturnsBrokenRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := "CreateIsCreateIfAbsent"
		var got []string
		err := conformance.CheckStore(t.Context(), mutantHarness(mutants, "create-overwrites"),
			conformance.Select(func(r string) bool { return r == "Store/"+rule }),
			conformance.OnResult(func(r conformance.Result) { got = append(got, r.Rule) }))
		require.Equal(t, []string{"Store/" + rule}, got)
		re, ok := errors.AsType[*conformance.RuleError](err)
		require.True(t, ok, "want a *RuleError, got %v", err)
		assert.Equal(t, "Store/"+rule, re.Rule)
		assert.Contains(t, re.Contract, "Create writes key if it is absent")
		assert.Contains(t, re.Error(), "create is create-if-absent")
	})
}

// A cancelled run returns at once and reports the rules it did not finish
// as failed.
func TestCheckStoreStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := conformance.CheckStore(ctx, mutantHarness(mutants, "none"))
	require.Error(t, err)
	assert.ErrorContains(t, err, "the run ended before the rule did")
}

// Virtual time needs a synctest bubble per rule, hence a testing.T.
func TestCheckStoreRefusesVirtualTime(t *testing.T) {
	err := conformance.CheckStore(t.Context(), mutantHarness(mutants, "none"), conformance.VirtualTime())
	require.ErrorContains(t, err, "VirtualTime needs a testing.T")
}

// failingCloseHarness is a working harness whose Close fails, as one does
// whose cleanup the server denies (a NOPERM on DeleteJob).
type failingCloseHarness struct{ conformance.Harness }

func (failingCloseHarness) Close() error {
	return errors.New("NOPERM this user has no permissions to run the 'scan' command")
}

// A harness that fails to clean up fails the rule, naming the error: its
// namespace may be left on the server.
func TestAHarnessThatCannotCloseFailsTheRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := mutantHarness(mutants, "none")
		rule := "CreateIsCreateIfAbsent"
		err := conformance.CheckStore(t.Context(), func(t testing.TB) conformance.Harness {
			return failingCloseHarness{inner(t)}
		}, conformance.Select(func(r string) bool { return r == "Store/"+rule }))
		re, ok := errors.AsType[*conformance.RuleError](err)
		require.True(t, ok, "want a *RuleError, got %v", err)
		assert.Contains(t, re.Error(), "harness: close: NOPERM")
	})
}
