package filesource_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// One big file and three small ones, one split each (no plan-time
// ranges), for three workers of one lane each: once the small splits are
// done the fleet idles while one worker reads the big file, so the leader
// asks its owner to divide it, and the residuals are read by the others.
// Every line is written exactly once (no line lost, none read by both
// halves of a division), and the big file's lines come from more than one
// worker.
func TestAnIdleFleetDividesTheBigSplit(t *testing.T) {
	in := t.TempDir()
	files := map[string]string{}
	var big strings.Builder
	for i := range 8000 {
		fmt.Fprintf(&big, "big line %06d padding padding padding padding\n", i)
	}
	files["big.log"] = big.String()
	for f := range 3 {
		var b strings.Builder
		for i := range 200 {
			fmt.Fprintf(&b, "small %d line %04d\n", f, i)
		}
		files[fmt.Sprintf("s%d.log", f)] = b.String()
	}
	lines := corpus(t, in, files)
	popts := filesource.PlannerOptions{TargetBytes: 64 << 20, MaxFiles: 1, MinSplits: 1}
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	var workers []*worker
	var regs []*prometheus.Registry
	for _, name := range []string{"a", "b", "c"} {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		workers = append(workers, startWorkerWith(t, name, store, in, popts, 1, reg))
	}
	seen := map[string]int{}
	bigBy := map[string]int{}
	for _, w := range workers {
		r := w.wait(t)
		require.Equal(t, pipeline.Completed, r.State, "%s: %+v", w.name, r)
		for key, n := range outputLines(t, w.out, 2) {
			seen[key] += n
			if strings.HasPrefix(key, "big.log:") {
				bigBy[w.name] += n
			}
		}
	}
	missing, dups, alien := exactlyOnce(lines, seen)
	require.Zero(t, missing, "lines lost")
	require.Zero(t, dups, "lines written twice")
	require.Zero(t, alien, "lines that are not input")
	var divisions, asks float64
	for _, reg := range regs {
		divisions += counterOr0(t, reg, "spate_coordination_divisions_total")
		asks += counterOr0(t, reg, "spate_coordination_division_asks_total")
	}
	t.Logf("divisions %v, asks %v, the big file's lines by worker %v", divisions, asks, bigBy)
	require.NotZero(t, divisions, "no split was divided")
	require.GreaterOrEqual(t, len(bigBy), 2, "the big file was read by one worker only: %v", bigBy)
	// Bounded: each division answers one piece of an ask, an ask asks
	// for at most one piece per member with nothing to do (2 of these 3),
	// and one split is asked at most once per tenancy and count of
	// children.
	require.LessOrEqual(t, divisions, 2*asks)
}

// counterOr0 is a label-less counter's value, 0 if it was never touched.
func counterOr0(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}
