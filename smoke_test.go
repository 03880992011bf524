package spate_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

type planner struct {
	fp     string
	splits int
}

func (p planner) Fingerprint() string { return p.fp }
func (p planner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var s []spate.PlannedSplit
	for i := range p.splits {
		s = append(s, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("s%02d", i)), []byte("d"))))
	}
	return spate.NewSplitPlan(s, spate.PlanFinal), nil
}

func TestSmoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := mem.MustNew(mem.Options{TTL: 1500 * time.Millisecond})
		defer store.Close()
		cfg := spate.Config{LeaseDuration: 1500 * time.Millisecond, OpTimeout: 200 * time.Millisecond,
			ReplanInterval: 1500 * time.Millisecond, ReconcileInterval: 300 * time.Millisecond,
			DrainDeadline: 750 * time.Millisecond, RebalanceDelay: spate.NoRebalanceDelay}
		var cs []*spate.StoreCoordinator
		for i := range 3 {
			c := cfg
			c.InstanceID = fmt.Sprintf("w%d", i)
			co, err := spate.NewStoreCoordinator(store, c)
			if err != nil {
				t.Fatal(err)
			}
			if err := co.Start(planner{fp: "smoke", splits: 9}); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, co)
		}
		done := map[int]bool{}
		gained := map[int]int{}
		for step := 0; len(done) < 3 && step < 1000; step++ {
			time.Sleep(10 * time.Millisecond)
			for i, co := range cs {
				evs, err := co.Poll()
				if err != nil {
					t.Fatalf("w%d: %v", i, err)
				}
				for _, ev := range evs {
					t.Logf("w%d %v", i, ev)
					switch e := ev.(type) {
					case spate.Gained:
						gained[i]++
						if err := co.Commit(t.Context(), e.Split.ID, spate.CompletedProgress(10, nil)); err != nil {
							t.Logf("commit: %v", err)
						}
					case spate.AllComplete:
						done[i] = true
					}
				}
			}
		}
		if len(done) < 3 {
			t.Fatalf("not complete: %v", done)
		}
		t.Logf("gained per worker: %v", gained)
		for _, co := range cs {
			co.Close()
		}
	})
}
