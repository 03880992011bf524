package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/spate-go/spate"
)

// FailoverHooks let [RunFailover] break and mend the deployment under test.
type FailoverHooks struct {
	// Fail breaks the store mid-job: kill the raft leader member, a cluster
	// node, restart the server. It runs while the workers hold splits and
	// have committed progress.
	Fail func(t testing.TB)
	// Heal, if set, runs after the job has gone on for a while without the
	// failed part (restart the member).
	Heal func(t testing.TB)
}

// RunFailover runs a bounded three-worker job and breaks the store in the
// middle of it. The job must still complete on every worker, no committed
// watermark may regress, a commit may land only for the current owner, and
// every split must end completed at its full watermark.
func RunFailover(t *testing.T, newHarness HarnessMaker, hooks FailoverHooks, opts ...Option) {
	const name = "JobSurvivesStoreFailover"
	o, err := collect("Failover", []string{name}, opts)
	if err != nil {
		t.Fatal(err)
	}
	run(t, o, name, newHarness, func(e *env) {
		const records = 60
		f := newFleet(e, planOf("failover", 9))
		ws := []*worker{
			f.start("a", withRecords(records)),
			f.start("b", withRecords(records)),
			f.start("c", withRecords(records)),
		}
		f.until(20*leases(f), "every worker holding splits with progress", func() bool {
			for _, w := range ws {
				if len(w.held) == 0 {
					return false
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			return len(f.commits) >= 3
		})
		failed := time.Now()
		hooks.Fail(e.t)
		e.t.Logf("store failed at %v into the job", time.Since(failed))
		if hooks.Heal != nil {
			f.hold(2*leases(f), "the fleet running on", func() bool { return true })
			hooks.Heal(e.t)
		}
		f.until(60*leases(f), "AllComplete on every worker", func() bool {
			for _, w := range ws {
				if !w.saw(isAllComplete) {
					return false
				}
			}
			return true
		})
		f.checkCommitHistory()
		var js *spate.JobState
		deadline := time.Now().Add(10 * leases(f))
		for {
			s, err := e.h.NewStore(e.ctx)
			if err == nil {
				s = bind(e, s)
				ctx, cancel := context.WithTimeout(e.ctx, leases(f))
				js, err = spate.InspectJob(ctx, s, "")
				cancel()
				s.Close()
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("inspect after the failover: %v", err)
			}
			time.Sleep(leases(f) / 4)
		}
		for _, s := range js.Splits {
			if s.Status != spate.StatusCompleted || s.Progress == nil || s.Progress.Watermark != records {
				e.t.Errorf("rule: every split ends completed at its full watermark; %v", s)
			}
		}
	})
}
