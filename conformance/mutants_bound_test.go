package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// Every rule ends with a verdict within its own bound whatever the driver
// does inside a call (conformance/bound.go). These drivers are the
// in-memory store with a call (Watch, Get, List) that misbehaves in time,
// not in content; TestRulesEndWhateverTheDriverDoes runs against each
// the rules that once ran until the test binary's timeout (the watch rules)
// or hung on the call (a Get or List that never returned).

// boundRules are the rules that hung: their writer never blocked, so in
// the suite's synctest bubble a Watch waiting on a timer never returned.
var boundRules = []string{"WatchHasNoGaps", "WatchKeepsEachKeysRevisionOrder"}

// watchHook makes a mutant whose Watch runs before (sh, ctx) first; before
// returns false when the harness closed while it waited.
func watchHook(before func(sh *shared, ctx context.Context) bool) func(*shared, *mem.Store) spate.Store {
	return func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
			if !before(sh, ctx) {
				return nil, spate.Retryablef("the store closed")
			}
			return s.Watch(ctx, ks, p)
		}}
	}
}

// getHook makes a mutant whose Get runs before (sh, ctx) first, as watchHook.
func getHook(before func(sh *shared, ctx context.Context) bool) func(*shared, *mem.Store) spate.Store {
	return func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, get: func(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
			if !before(sh, ctx) {
				return spate.Entry{}, false, spate.Retryablef("the store closed")
			}
			return s.Get(ctx, ks, key)
		}}
	}
}

// spin keeps the CPU busy, never blocking, until the harness closes.
func spin(sh *shared, _ context.Context) bool {
	for {
		select {
		case <-sh.closed:
			return false
		default:
		}
	}
}

// getRules and listRules are rules whose first calls include Get and List;
// coordBoundRules, a coordinator rule whose workers list the job's splits.
var (
	coordBoundRules = []string{"TwoWorkersPartitionDisjointly"}
	getRules        = []string{"GetReadsTheLatestWrite"}
	listRules       = []string{"ListReturnsLiveKeys"}
)

var boundMutants = []mutant{
	// Every call of a rule is bounded, not only Watch: a Get or a List
	// that sleeps, never returns or spins ends the rule naming the call.
	{name: "get-waits-a-millisecond", wrap: getHook(func(sh *shared, _ context.Context) bool {
		return sh.sleep(time.Millisecond)
	})},
	{name: "get-sleeps", breaks: getRules, wrap: getHook(func(sh *shared, _ context.Context) bool {
		return sh.sleep(24 * time.Hour)
	})},
	{name: "get-never-returns", breaks: getRules, wrap: getHook(func(sh *shared, _ context.Context) bool {
		<-sh.closed
		return false
	})},
	{name: "get-spins", breaks: getRules, wrap: getHook(spin)},
	{name: "list-never-returns", breaks: listRules, wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
			<-sh.closed
			return nil, spate.Retryablef("the store closed")
		}}
	}},

	// A coordinator's call: the listing of the job's splits never
	// returns, deaf to its context. The coordinator calls it from its own
	// goroutines, through the store the fleet opened for the worker.
	{name: "split-listing-never-returns", breaks: coordBoundRules, wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
			if ks == spate.Durable && p == "split." {
				<-sh.closed
				return nil, spate.Retryablef("the store closed")
			}
			return s.List(ctx, ks, p)
		}}
	}},

	// A retry back-off before subscribing: a driver that keeps the
	// contract. The rules must pass on it (they once never ended).
	{name: "watch-waits-a-millisecond", wrap: watchHook(func(sh *shared, _ context.Context) bool {
		return sh.sleep(time.Millisecond)
	})},
	// Sleeps far past any bound, deaf to its context.
	{name: "watch-sleeps", breaks: boundRules, wrap: watchHook(func(sh *shared, _ context.Context) bool {
		return sh.sleep(24 * time.Hour)
	})},
	// Never returns while the store is open, deaf to its context.
	{name: "watch-never-returns", breaks: boundRules, wrap: watchHook(func(sh *shared, _ context.Context) bool {
		<-sh.closed
		return false
	})},
	// Spins without ever blocking until the store is closed.
	{name: "watch-spins", breaks: boundRules, wrap: watchHook(spin)},
}

func TestRulesEndWhateverTheDriverDoes(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	// In a synctest bubble (virtual time), through CheckStore: a Watch that
	// waits on a timer or on a channel costs no wall time.
	for _, c := range []struct{ name, call string }{
		{"watch-waits-a-millisecond", ""},
		{"watch-sleeps", `Watch\((durable|ephemeral), "[^"]*"\)`},
		{"watch-never-returns", `Watch\((durable|ephemeral), "[^"]*"\)`},
		{"get-waits-a-millisecond", ""},
		{"get-sleeps", `Get\((durable|ephemeral), "gl\.k"\)`},
		{"get-never-returns", `Get\((durable|ephemeral), "gl\.k"\)`},
		{"list-never-returns", `List\((durable|ephemeral), "ll\."\)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := boundMutants[slices.IndexFunc(boundMutants, func(m mutant) bool { return m.name == c.name })]
			failed := catch(t, conformance.CheckStore, mutantHarness(boundMutants, c.name), targetRules(m))
			if m.breaks == nil {
				require.Empty(t, failed, "a call that waits a millisecond keeps the contract, yet rules failed:\n%s", verdicts(failed))
				return
			}
			for _, r := range m.breaks {
				require.Contains(t, failed, r, "%s: the rule must end with a verdict", c.name)
				line := ruleLine(failed[r])
				assert.Contains(t, line, "a store call returns within its bound", "%s: %s failed, but not on the bound:\n%s", c.name, r, strings.Join(failed[r], "\n"))
				assert.Regexp(t, c.call+` did not return within 30s`, line, "%s: the verdict names the call", c.name)
			}
			t.Logf("%s:\n%s", c.name, verdicts(failed))
		})
	}
	// A coordinator rule: the stores the fleet opens for its workers are
	// bounded too, so a call a coordinator makes that never returns fails
	// the rule naming the call (once, the coordinator hung on it and the
	// rule ended on its own wait, naming nothing, or not at all).
	t.Run("split-listing-never-returns", func(t *testing.T) {
		t.Parallel()
		const name = "split-listing-never-returns"
		m := boundMutants[slices.IndexFunc(boundMutants, func(m mutant) bool { return m.name == name })]
		failed := catch(t, conformance.CheckCoordinator, mutantHarness(boundMutants, name), m.breaks)
		for _, r := range m.breaks {
			require.Contains(t, failed, r, "%s: the rule must end with a verdict", name)
			log := strings.Join(failed[r], "\n")
			assert.Contains(t, log, "a store call returns within its bound", "%s: %s failed, but not on the bound:\n%s", name, r, log)
			assert.Contains(t, log, `List(durable, "split.") did not return within 30s`, "%s: the verdict names the call:\n%s", name, log)
		}
		t.Logf("%s:\n%s", name, verdicts(failed))
	})
	// A Watch that spins keeps a bubble's virtual time still, so only the
	// real-time watchdog of RunStore can end the rule: it ends the test
	// binary naming the rule and the call. Run in a subprocess.
	for _, c := range []struct{ name, verdict string }{
		{"watch-spins", `(WatchHasNoGaps|WatchKeepsEachKeysRevisionOrder): Watch\((durable|ephemeral), "[^"]*"\)`},
		{"get-spins", `GetReadsTheLatestWrite: Get\((durable|ephemeral), "gl\.k"\)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := boundMutants[slices.IndexFunc(boundMutants, func(m mutant) bool { return m.name == c.name })]
			pattern := "^TestBoundMutantTarget$/^(" + strings.Join(targetRules(m), "|") + ")$"
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), "SPATE_MUTANT="+c.name)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "a driver whose call spins must fail the run:\n%s", out)
			s := string(out)
			assert.NotContains(t, s, "test timed out", "the run ended only at the binary's timeout, not at the rule's bound")
			assert.Regexp(t, `conformance: rule TestBoundMutantTarget/`+c.verdict+` has not returned after 10s of real time`, s,
				"the verdict names the rule and the call:\n%s", s)
			assert.Contains(t, s, "busy loop")
		})
	}
}

// targetRules are the rules a bound mutant is run against: those it
// breaks, or, for one that keeps the contract, those of its call.
func targetRules(m mutant) []string {
	switch {
	case m.breaks != nil:
		return m.breaks
	case strings.HasPrefix(m.name, "get-"):
		return getRules
	default:
		return boundRules
	}
}

// TestBoundMutantTarget runs the watch rules against the mutant
// SPATE_MUTANT names, in virtual time, under RunStore (whose watchdog
// works outside the bubble).
func TestBoundMutantTarget(t *testing.T) {
	name := os.Getenv("SPATE_MUTANT")
	if name == "" {
		t.Skip("runs only as a subprocess of TestRulesEndWhateverTheDriverDoes")
	}
	i := slices.IndexFunc(boundMutants, func(m mutant) bool { return m.name == name })
	require.GreaterOrEqual(t, i, 0, "SPATE_MUTANT=%s is no bound mutant", name)
	rules := targetRules(boundMutants[i])
	conformance.RunStore(t, mutantHarness(boundMutants, name), conformance.VirtualTime(),
		conformance.Select(func(rule string) bool {
			_, r, _ := strings.Cut(rule, "/")
			return slices.Contains(rules, r)
		}))
}
