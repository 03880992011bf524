package mem_test

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/stores/mem"
)

var (
	scaleWorkers = flag.String("scale", "", "comma-separated fleet sizes for TestScale (e.g. 10,100,1000); empty runs a 5-worker smoke check")
	scaleProfile = flag.String("scale-cpuprofile", "", "write a CPU profile of the last TestScale run's steady-state window to this file")
	scaleWindow  = flag.Duration("scale-window", 10*time.Second, "TestScale's steady-state window (virtual time): longer steadies a small fleet's CPU figure")
	scaleWatch   = flag.String("scale-watch", "both", "what TestScale's workers watch: keys, whole (the whole job: the baseline) or both")
)

// TestScale measures the fleet in virtual time (scale.Measure):
//
//	go test ./stores/mem -run '^TestScale$' -v -args -scale 10,100,1000
//
// Each size runs twice: every worker watching the whole job (the
// baseline), then each its own keys (the store's KeyWatcher);
// -scale-watch keys (or whole) runs one of them (a whole-job fleet of
// 1,000 × 100,000 does not fit in memory here). -scale-window 60s
// measures a longer steady state: at W = 10 the 10 s default holds about
// 0.1 s of CPU, and its per-worker figure varies 2× from run to run.
// -scale-cpuprofile FILE profiles the last run's window.
//
// Without -scale it runs 5 workers as a check that the harness works.
func TestScale(t *testing.T) {
	sizes := []int{5}
	if *scaleWorkers != "" {
		sizes = nil
		for _, f := range strings.Split(*scaleWorkers, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			sizes = append(sizes, n)
		}
	}
	var results []scale.Result
	var prof *windowProfiler
	if *scaleProfile != "" {
		prof = startWindowProfiler(t, *scaleProfile)
	}
	all := runs(sizes)
	for i, run := range all {
		w := run.workers
		synctest.Test(t, func(t *testing.T) {
			mk := func(testing.TB) conformance.Harness {
				return harness{root: mem.MustNew(mem.Options{TTL: 10 * time.Second})}
			}
			o := scale.Options{Workers: w, WholeJob: run.wholeJob, Window: *scaleWindow}
			if prof != nil && i == len(all)-1 {
				o.OnWindow = prof.window
			}
			r := scale.Measure(t, mk, o)
			t.Log(r.Row())
			results = append(results, r)
			require.Equal(t, r.Splits, r.Placed, "every split placed")
			require.Positive(t, r.EventsPerSec, "the fleet saw watch events")
			require.Positive(t, r.Takeover, "the dead worker's splits were taken over")
			require.Positive(t, r.ReadsAfterBreakMedian, "the median worker re-read what it watched after the break")
		})
	}
	scale.WriteTable(os.Stdout, results)
}

// windowProfiler profiles a scale run's steady-state window from a
// goroutine outside the synctest bubble (scale.Options.OnWindow).
type windowProfiler struct {
	req chan bool
	ack chan error
}

func startWindowProfiler(t *testing.T, path string) *windowProfiler {
	p := &windowProfiler{req: make(chan bool), ack: make(chan error)}
	f, err := os.Create(path)
	require.NoError(t, err)
	go func() {
		on := false
		for start := range p.req {
			if start {
				err := pprof.StartCPUProfile(f)
				on = err == nil
				p.ack <- err
			} else {
				pprof.StopCPUProfile()
				on = false
				p.ack <- f.Close()
			}
		}
		if on { // the run failed inside its window
			pprof.StopCPUProfile()
		}
		_ = f.Close() // a no-op error if the window closed it
	}()
	t.Cleanup(func() { close(p.req) })
	return p
}

func (p *windowProfiler) window(start bool) {
	p.req <- start
	if err := <-p.ack; err != nil {
		panic(fmt.Sprintf("scale CPU profile: %v", err))
	}
}

type scaleRun struct {
	workers  int
	wholeJob bool
}

// runs pairs each fleet size with both ways of watching: every worker the
// whole job (the baseline, as on a store without KeyWatcher), and each
// worker its own keys.
func runs(sizes []int) []scaleRun {
	var out []scaleRun
	for _, w := range sizes {
		if *scaleWatch != "keys" {
			out = append(out, scaleRun{w, true})
		}
		if *scaleWatch != "whole" {
			out = append(out, scaleRun{w, false})
		}
	}
	return out
}

// BenchmarkScale measures fleets over one in-memory store in real time
// (TestScale runs them in virtual time):
//
//	go test -run '^$' -bench 'Scale/workers=50/' -benchtime 1x -timeout 60m ./stores/mem
//
// Each size runs with every worker watching the whole job (watch=whole,
// the baseline) and with each its own keys (watch=keys).
func BenchmarkScale(b *testing.B) {
	for _, w := range []int{10, 50, 100} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			scale.BenchWatches(b, func(testing.TB) conformance.Harness {
				return harness{root: mem.MustNew(mem.Options{TTL: 10 * time.Second})}
			}, scale.Options{Workers: w})
		})
	}
}
