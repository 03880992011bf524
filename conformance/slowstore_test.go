package conformance_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// slowMutants keep the contract on a slow machine: every call is one
// round trip that takes 100 ms (virtual time), so the no-gaps rules'
// writers (150 steps of two or three writes) run for about 30 s, longer
// than the suite's event wait, while every event still arrives at once.
// Those rules once bounded the writer's whole run by that wait, and
// failed such a store (on etcd under load, with every key the watcher
// held reported as a delete never seen).
var slowMutants = []mutant{
	{name: "round-trips-of-100ms", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, pre: func(context.Context, spate.Keyspace) error {
			if !sh.sleep(100 * time.Millisecond) {
				return spate.Retryablef("the store closed")
			}
			return nil
		}}
	}},
}

func TestNoGapsRulesPassASlowStore(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	rules := []string{"WatchHasNoGaps", "WatchKeysHasNoGaps"}
	failed := catch(t, conformance.CheckStore, mutantHarness(slowMutants, "round-trips-of-100ms"), rules)
	require.Empty(t, failed, "a store whose calls take 100 ms keeps the contract, yet rules failed:\n%s", verdicts(failed))
}
