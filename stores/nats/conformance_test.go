package nats_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ttl is the lease TTL of the tests: the NATS floor, to keep wall time down.
const ttl = 2 * time.Second

// TestStoreConformance runs the store suite against one server, each rule
// on a job of its own (as TestStoreConformanceR3 shares its cluster and
// natstest.Start's harness maker shares its server): starting a JetStream
// server per rule cost the package more than the rules' own waits.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	conformance.RunStore(t, func(t testing.TB) conformance.Harness {
		return srv.Harness(t, spatenats.Options{TTL: ttl})
	})
}

// TestStoreConformanceR3 runs the store suite against a 3-node cluster with
// R3 file storage and sync_interval always: the production configuration.
// The harnesses share the cluster, each on its own job.
func TestStoreConformanceR3(t *testing.T) {
	t.Parallel()
	c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
	conformance.RunStore(t, func(t testing.TB) conformance.Harness {
		return c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3})
	})
}

// TestCoordinatorConformance shares one server between its rules, each on
// a job of its own, as TestStoreConformance does.
func TestCoordinatorConformance(t *testing.T) {
	t.Parallel()
	start := time.Now()
	srv := natsservers.Start(t)
	conformance.RunCoordinator(t, func(t testing.TB) conformance.Harness { return srv.Harness(t, spatenats.Options{TTL: ttl}) })
	t.Cleanup(func() { t.Logf("RunCoordinator wall time: %v", time.Since(start).Round(time.Millisecond)) })
}

// killOneNode stops node 1 of c (a node other than the one clients list
// first) and restarts it.
func killOneNode(c *natsservers.Cluster) conformance.FailoverHooks {
	down := -1
	return conformance.FailoverHooks{
		Fail: func(t testing.TB) {
			if down >= 0 {
				return
			}
			down = 1
			c.Nodes[down].Shutdown()
		},
		Heal: func(t testing.TB) {
			if down < 0 {
				return
			}
			c.Nodes[down].Restart(t)
			down = -1
		},
	}
}

// TestCoordinatorSurvivesNodeDeath runs a three-worker job on a three-node
// R3 cluster (file storage, sync_interval always) and kills one node
// mid-job.
func TestCoordinatorSurvivesNodeDeath(t *testing.T) {
	t.Parallel()
	c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
	conformance.RunFailover(t, func(t testing.TB) conformance.Harness {
		return c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3})
	}, killOneNode(c))
}

// TestChaos runs seeded fault scenarios on an R3 cluster, one of whose
// faults kills (and later restarts) a node. SPATE_CHAOS_SEEDS=n runs more.
func TestChaos(t *testing.T) {
	t.Parallel()
	c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
	hooks := killOneNode(c)
	conformance.RunChaos(t, func(t testing.TB) conformance.Harness {
		return c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3})
	}, conformance.ChaosOptions{Seeds: 2, Server: &hooks})
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, func(t testing.TB) conformance.Harness { return natsservers.NewHarness(t, ttl) })
}

// BenchmarkScale measures a fleet of 50 coordinators over one embedded
// nats-server in real time (scale.Measure; the server's CPU is
// in the figures):
//
//	go test -run '^$' -bench 'Scale' -benchtime 1x -timeout 60m ./stores/nats
//
// It runs with every worker watching the whole job (watch=whole, the
// baseline) and with each its own keys (watch=keys).
func BenchmarkScale(b *testing.B) {
	b.Run("workers=50", func(b *testing.B) {
		scale.BenchWatches(b, func(t testing.TB) conformance.Harness { return natsservers.NewHarness(t, 10*time.Second) },
			scale.Options{Workers: 50})
	})
}
