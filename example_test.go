package spate_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// rangePlanner divides the id range [0, 600) into six splits.
type rangePlanner struct{}

func (rangePlanner) Fingerprint() string { return "example:ids:v1" }

func (rangePlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var splits []spate.PlannedSplit
	for lo := 0; lo < 600; lo += 100 {
		id := spate.MustSplitID(fmt.Sprintf("ids-%03d-%03d", lo, lo+100))
		splits = append(splits, spate.NewPlannedSplit(spate.NewSplitSpec(id, fmt.Appendf(nil, "%d:%d", lo, lo+100))))
	}
	return spate.NewSplitPlan(splits, spate.PlanFinal), nil
}

// Three workers share one in-memory store and complete a bounded job: each
// gains splits, processes them, and commits them completed with a fenced
// commit; every worker — busy or idle — sees AllComplete.
func Example() {
	store := mem.MustNew(mem.Options{TTL: 300 * time.Millisecond})
	defer store.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	var (
		mu   sync.Mutex
		done []string
		wg   sync.WaitGroup
	)
	for i := range 3 {
		cfg := spate.Config{
			InstanceID:        fmt.Sprintf("worker-%d", i),
			LeaseDuration:     300 * time.Millisecond, // must equal the store's TTL
			OpTimeout:         100 * time.Millisecond,
			ReplanInterval:    300 * time.Millisecond,
			ReconcileInterval: 100 * time.Millisecond,
			DrainDeadline:     150 * time.Millisecond,
			RebalanceDelay:    spate.NoRebalanceDelay,
		}
		c, err := spate.NewStoreCoordinator(store, cfg, spate.WithLogger(quiet))
		if err != nil {
			panic(err)
		}
		waker := spate.NewWaker()
		c.SetWaker(waker)
		if err := c.Start(rangePlanner{}); err != nil {
			panic(err)
		}
		wg.Go(func() {
			defer c.Close()
			for {
				select { // park until the coordinator has something
				case <-waker.C():
				case <-time.After(50 * time.Millisecond):
				}
				events, err := c.Poll()
				if err != nil {
					panic(err)
				}
				for _, ev := range events {
					switch e := ev.(type) {
					case spate.Gained:
						// Process the descriptor's range, then commit it
						// completed. A Fenced error means another worker
						// took the split over: nothing was written.
						var lo, hi int64
						fmt.Sscanf(string(e.Split.Descriptor), "%d:%d", &lo, &hi)
						err := c.CommitAt(context.Background(), e.Split.ID, e.Epoch, spate.CompletedProgress(hi, nil))
						if err == nil {
							mu.Lock()
							done = append(done, e.Split.ID.String())
							mu.Unlock()
						}
					case spate.RevokeRequested:
						_ = c.DeclineRevoke(context.Background(), e.Split)
					case spate.AllComplete:
						return
					}
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(done)
	fmt.Println(slices.Compact(done))

	js, err := spate.InspectJob(context.Background(), store, "")
	if err != nil {
		panic(err)
	}
	fmt.Println("plan:", js.Plan.Finality, js.Plan.Planned, "splits")
	for _, s := range js.Splits {
		fmt.Println(s.ID, s.Status, s.Progress.Watermark)
	}
	// Output:
	// [ids-000-100 ids-100-200 ids-200-300 ids-300-400 ids-400-500 ids-500-600]
	// plan: final 6 splits
	// ids-000-100 completed 100
	// ids-100-200 completed 200
	// ids-200-300 completed 300
	// ids-300-400 completed 400
	// ids-400-500 completed 500
	// ids-500-600 completed 600
}
