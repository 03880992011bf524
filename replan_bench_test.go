package spate

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkReplanOfAnOpenPlan is one replan of an open plan of n splits
// that found 10 new ones (an input of n files, 10 of them new): seed=view
// seeds what the leader's view does not hold, as the coordinator does;
// seed=all seeds every planned split again (create-if-absent, all but 10
// losing) and lists the job to recount it, as it did before. It reports
// the store calls of a run beside its time. The planner's own listing is
// not in it (a prebuilt plan).
func BenchmarkReplanOfAnOpenPlan(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, mode := range []string{"view", "all"} {
			b.Run(fmt.Sprintf("splits=%d/seed=%s", n, mode), func(b *testing.B) {
				st := newFakeStore()
				m, err := newCoordMetrics(nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				snap := planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen}
				rev := st.put(Durable, keyPlan, encode(&snap))
				splits := make([]PlannedSplit, n, n+10)
				known := make(map[string]struct{}, n)
				for i := range splits {
					splits[i] = planned(fmt.Sprintf("s%07d", i), 1)
					known[splits[i].Spec.ID.String()] = struct{}{}
				}
				run := planRun{st: st, planner: fixedPlan(NewSplitPlan(splits, PlanOpen)), fpHash: testFPHash, m: m}
				res := run.run(ctx, snap, rev)
				if res.outcome != planOK {
					b.Fatalf("seeding: %v %v", res.outcome, res.err)
				}
				var mu sync.Mutex
				calls := map[string]int{}
				st.setFault(func(c fakeCall) fakeFault {
					mu.Lock()
					calls[c.op]++
					mu.Unlock()
					return fakeFault{}
				})
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					grown := splits[:n:n]
					for j := range 10 {
						grown = append(grown, planned(fmt.Sprintf("new-%d-%d", i, j), 1))
					}
					run.planner = fixedPlan(NewSplitPlan(grown, PlanOpen))
					run.known = nil
					if mode == "view" {
						run.known = known
					}
					res = run.run(ctx, *res.plan, res.rev)
					if res.outcome != planOK || res.created != 10 {
						b.Fatalf("replan: %v created %d: %v", res.outcome, res.created, res.err)
					}
					for _, s := range grown[n:] {
						known[s.Spec.ID.String()] = struct{}{}
					}
					b.StopTimer()
					st.mu.Lock()
					st.calls = st.calls[:0] // the fake keeps every call; not the run's cost
					st.mu.Unlock()
					b.StartTimer()
				}
				b.StopTimer()
				b.ReportMetric(float64(calls["create"])/float64(b.N), "creates/op")
				b.ReportMetric(float64(calls["update"])/float64(b.N), "updates/op")
				b.ReportMetric(float64(calls["list"])/float64(b.N), "lists/op")
			})
		}
	}
}
