package etcd_test

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/etcdtest"
)

// testTTL is the ephemeral TTL of the tests: etcd leases have one-second
// resolution, and the embedded server's floor is 1 s.
const testTTL = 2 * time.Second

func TestStoreConformance(t *testing.T) {
	t.Parallel()
	start := time.Now()
	conformance.RunStore(t, etcdtest.Maker(testTTL))
	t.Cleanup(func() { t.Logf("RunStore wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

func TestCoordinatorConformance(t *testing.T) {
	t.Parallel()
	start := time.Now()
	conformance.RunCoordinator(t, etcdtest.Maker(testTTL))
	t.Cleanup(func() { t.Logf("RunCoordinator wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, etcdtest.Maker(testTTL)) }
