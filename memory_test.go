package spate_test

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemoryPerSplit reports what a coordinator keeps per split in its
// view of the job (every worker views every split, held or not; a held split
// adds one small tenancy record). Weight 1, empty descriptors: a descriptor
// adds its own length.
func BenchmarkMemoryPerSplit(b *testing.B) {
	const n = 20000
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for b.Loop() {
		store := mem.MustNew(mem.Options{TTL: 3 * time.Second})
		cfg := spate.Config{LeaseDuration: 3 * time.Second, OpTimeout: time.Second, ReplanInterval: time.Hour,
			ReconcileInterval: time.Hour, DrainDeadline: time.Second, RebalanceDelay: spate.NoRebalanceDelay}
		p := plan("mem", n)
		start := func(id string, lanes int) (*spate.StoreCoordinator, spate.Waker) {
			c := cfg
			c.InstanceID, c.MaxInFlight = id, lanes
			co, err := spate.NewStoreCoordinator(store, c, spate.WithLogger(quiet))
			if err != nil {
				b.Fatal(err)
			}
			w := spate.NewWaker()
			co.SetWaker(w)
			if err := co.Start(p); err != nil {
				b.Fatal(err)
			}
			return co, w
		}
		wait := func(co *spate.StoreCoordinator, w spate.Waker, gains int) {
			got := 0
			for deadline := time.Now().Add(2 * time.Minute); got < gains; {
				if time.Now().After(deadline) {
					b.Fatalf("gained %d of %d", got, gains)
				}
				select {
				case <-w.C():
				case <-time.After(100 * time.Millisecond):
				}
				evs, err := co.Poll()
				if err != nil {
					b.Fatal(err)
				}
				for _, ev := range evs {
					if _, ok := ev.(spate.Gained); ok {
						got++
					}
				}
			}
		}
		// The owner plans and holds every split.
		owner, ow := start("owner", n)
		wait(owner, ow, n)
		base := heap()
		// A standby with one lane: its view holds every split, it holds one.
		standby, sw := start("standby", 1)
		time.Sleep(time.Second) // its snapshot is applied synchronously at start
		_ = sw
		view := heap()
		b.ReportMetric(float64(view-base)/n, "view-B/split")
		standby.Close()
		owner.Close()
		store.Close()
	}
}
