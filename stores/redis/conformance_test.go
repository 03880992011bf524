package redis_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/internal/redisservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTTL keeps the suite's expiry waits short.
const testTTL = 1500 * time.Millisecond

// TestStoreConformance runs the contract on a server set up as the package
// doc asks (appendonly yes, appendfsync always): RequiredSettingsAreMet
// holds only there.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
	conformance.RunStore(t, srv.HarnessMaker(testTTL))
}

// TestStoreConformanceOnClusterWithACLAndTLS runs the contract through a
// ClusterClient on a one-node Redis Cluster that speaks only TLS (with
// client certificates), logged in as an ACL user granted only what the
// package doc lists. Cluster mode refuses any script whose keys span hash
// slots, so this also proves the job's hash tag.
func TestStoreConformanceOnClusterWithACLAndTLS(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithCluster(), redisservers.WithTLS(),
		redisservers.WithUser("spate", password, append(aclRules("~spate:*"), "+cluster|slots")...))
	conformance.RunStore(t, srv.HarnessMaker(testTTL, login("spate", password)),
		conformance.Skip("RequiredSettingsAreMet", "a scratch cluster without persistence; TestStoreConformance runs the rule with AOF"))
}

func TestCoordinatorConformance(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	start := time.Now()
	conformance.RunCoordinator(t, srv.HarnessMaker(testTTL))
	t.Cleanup(func() { t.Logf("RunCoordinator wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

// TestCoordinatorSurvivesServerRestart runs a three-worker job on a server
// with AOF (appendfsync always) and kills and restarts the server mid-job:
// committed progress survives and the job completes.
func TestCoordinatorSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
	conformance.RunFailover(t, srv.HarnessMaker(testTTL), conformance.FailoverHooks{
		Fail: func(testing.TB) { srv.Kill() },
		Heal: func(testing.TB) { srv.StartAgain() },
	})
}

func BenchmarkConformance(b *testing.B) {
	srv := redisservers.Start(b)
	conformance.RunBenchmarks(b, srv.HarnessMaker(testTTL))
}

// TestChaos runs seeded fault scenarios, one of whose faults kills the
// server (AOF, appendfsync always) and later restarts it.
// SPATE_CHAOS_SEEDS=n runs more.
func TestChaos(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
	conformance.RunChaos(t, srv.HarnessMaker(testTTL), conformance.ChaosOptions{Seeds: 2, Server: &conformance.FailoverHooks{
		Fail: func(testing.TB) { srv.Kill() },
		Heal: func(testing.TB) { srv.StartAgain() },
	}})
}

// BenchmarkScale measures a fleet of 50 coordinators over one spawned
// redis-server in real time (scale.Measure):
//
//	go test -run '^$' -bench 'Scale' -benchtime 1x -timeout 60m ./stores/redis
//
// It runs with every worker watching the whole job (watch=whole, the
// baseline) and with each its own keys (watch=keys).
func BenchmarkScale(b *testing.B) {
	b.Run("workers=50", func(b *testing.B) {
		scale.BenchWatches(b, func(t testing.TB) conformance.Harness {
			return redisservers.Start(t).HarnessMaker(10 * time.Second)(t)
		}, scale.Options{Workers: 50})
	})
}
