package etcd_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/etcdservers"
)

// TestCoordinatorSurvivesLeaderMemberDeath runs a three-worker job on a
// three-member cluster and kills the raft leader member mid-job.
func TestCoordinatorSurvivesLeaderMemberDeath(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{Members: 3})
	killed := -1
	conformance.RunFailover(t, func(t testing.TB) conformance.Harness { return c.NewHarness(t, testTTL) },
		conformance.FailoverHooks{
			Fail: func(t testing.TB) {
				leader, err := c.WaitLeader(10 * time.Second)
				require.NoError(t, err)
				killed = leader
				c.Kill(leader)
				t.Logf("killed leader member %d", leader)
			},
			Heal: func(t testing.TB) {
				require.NoError(t, c.Restart(killed))
			},
		})
}

// TestChaos runs seeded fault scenarios on a three-member cluster, one of
// whose faults kills (and later restarts) the raft leader member.
// SPATE_CHAOS_SEEDS=n runs more.
func TestChaos(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{Members: 3})
	killed := -1
	conformance.RunChaos(t, func(t testing.TB) conformance.Harness { return c.NewHarness(t, testTTL) },
		conformance.ChaosOptions{Seeds: 2, Server: &conformance.FailoverHooks{
			Fail: func(t testing.TB) {
				if killed >= 0 {
					return
				}
				leader, err := c.WaitLeader(10 * time.Second)
				require.NoError(t, err)
				killed = leader
				c.Kill(leader)
			},
			Heal: func(t testing.TB) {
				if killed < 0 {
					return
				}
				require.NoError(t, c.Restart(killed))
				killed = -1
			},
		}})
}
