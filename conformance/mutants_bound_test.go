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
// in-memory store with a Watch that misbehaves in time, not in content;
// TestWatchRulesEndWhateverTheDriverDoes runs the watch rules that once
// ran until the test binary's timeout against each.

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

var boundMutants = []mutant{
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
	{name: "watch-spins", breaks: boundRules, wrap: watchHook(func(sh *shared, _ context.Context) bool {
		for {
			select {
			case <-sh.closed:
				return false
			default:
			}
		}
	})},
}

func TestWatchRulesEndWhateverTheDriverDoes(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	// In a synctest bubble (virtual time), through CheckStore: a Watch that
	// waits on a timer or on a channel costs no wall time.
	for _, name := range []string{"watch-waits-a-millisecond", "watch-sleeps", "watch-never-returns"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := boundMutants[slices.IndexFunc(boundMutants, func(m mutant) bool { return m.name == name })]
			failed := catch(t, conformance.CheckStore, mutantHarness(boundMutants, name), boundRules)
			if m.breaks == nil {
				require.Empty(t, failed, "a Watch that waits a millisecond keeps the contract, yet rules failed:\n%s", verdicts(failed))
				return
			}
			for _, r := range m.breaks {
				require.Contains(t, failed, r, "%s: the rule must end with a verdict", name)
				line := ruleLine(failed[r])
				assert.Contains(t, line, "a store call returns within its bound", "%s: %s failed, but not on the bound:\n%s", name, r, strings.Join(failed[r], "\n"))
				assert.Regexp(t, `Watch\((durable|ephemeral), "[^"]*"\) did not return`, line, "%s: the verdict names the call", name)
			}
			t.Logf("%s:\n%s", name, verdicts(failed))
		})
	}
	// A Watch that spins keeps a bubble's virtual time still, so only the
	// real-time watchdog of RunStore can end the rule: it ends the test
	// binary naming the rule and the call. Run in a subprocess.
	t.Run("watch-spins", func(t *testing.T) {
		t.Parallel()
		pattern := "^TestBoundMutantTarget$/^(" + strings.Join(boundRules, "|") + ")$"
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=5m")
		cmd.Env = append(os.Environ(), "SPATE_MUTANT=watch-spins")
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "a driver whose Watch spins must fail the run:\n%s", out)
		s := string(out)
		assert.NotContains(t, s, "test timed out", "the run ended only at the binary's timeout, not at the rule's bound")
		assert.Regexp(t, `conformance: rule TestBoundMutantTarget/(WatchHasNoGaps|WatchKeepsEachKeysRevisionOrder): Watch\((durable|ephemeral), "[^"]*"\) has not returned after 10s of real time`, s,
			"the verdict names the rule and the call:\n%s", s)
		assert.Contains(t, s, "busy loop")
	})
}

// TestBoundMutantTarget runs the watch rules against the mutant
// SPATE_MUTANT names, in virtual time, under RunStore (whose watchdog
// works outside the bubble).
func TestBoundMutantTarget(t *testing.T) {
	name := os.Getenv("SPATE_MUTANT")
	if name == "" {
		t.Skip("runs only as a subprocess of TestWatchRulesEndWhateverTheDriverDoes")
	}
	conformance.RunStore(t, mutantHarness(boundMutants, name), conformance.VirtualTime(),
		conformance.Select(func(rule string) bool {
			_, r, _ := strings.Cut(rule, "/")
			return slices.Contains(boundRules, r)
		}))
}
