package etcd_test

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
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
