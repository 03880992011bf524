package redis_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTTL keeps the suite's expiry waits short.
const testTTL = 1500 * time.Millisecond

func TestStoreConformance(t *testing.T) {
	srv := redistest.Start(t)
	conformance.RunStore(t, srv.HarnessMaker(testTTL))
}

// TestStoreConformanceOnCluster runs the contract through a ClusterClient on
// a one-node Redis Cluster, which refuses any script whose keys span hash
// slots: the job's hash tag keeps them in one.
func TestStoreConformanceOnCluster(t *testing.T) {
	srv := redistest.Start(t, redistest.WithCluster())
	conformance.RunStore(t, srv.HarnessMaker(testTTL))
}
