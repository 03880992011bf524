package etcd_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
)

// testTTL is the ephemeral TTL of the tests: etcd leases have one-second
// resolution, and the embedded server's floor is 1 s.
const testTTL = 2 * time.Second

// The suite runs on the exported test server, as a user's test would (see
// examples/conformance-etcd).
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	start := time.Now()
	conformance.RunStore(t, etcdtest.Start(t).HarnessMaker(testTTL))
	t.Cleanup(func() { t.Logf("RunStore wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

func TestCoordinatorConformance(t *testing.T) {
	t.Parallel()
	start := time.Now()
	conformance.RunCoordinator(t, etcdtest.Start(t).HarnessMaker(testTTL))
	t.Cleanup(func() { t.Logf("RunCoordinator wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, etcdtest.Start(b).HarnessMaker(testTTL))
}

// BenchmarkScale measures a fleet of W coordinators over one embedded etcd
// member in real time (scale.Measure; the server's CPU is in the
// figures, it runs in the test process):
//
//	go test -run '^$' -bench 'Scale/workers=50/' -benchtime 1x -timeout 60m ./stores/etcd
//
// Each size runs with every worker watching the whole job (watch=whole,
// the baseline) and with each its own keys (watch=keys).
func BenchmarkScale(b *testing.B) {
	for _, w := range []int{10, 50, 100} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			scale.BenchWatches(b, func(t testing.TB) conformance.Harness {
				return etcdtest.Start(t).HarnessMaker(10 * time.Second)(t)
			}, scale.Options{Workers: w})
		})
	}
}
