package etcd_test

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/etcdtest"
)

// TestCoordinatorSurvivesLeaderMemberDeath runs a three-worker job on a
// three-member cluster and kills the raft leader member mid-job.
func TestCoordinatorSurvivesLeaderMemberDeath(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	killed := -1
	conformance.RunFailover(t, func(t testing.TB) conformance.Harness { return c.NewHarness(t, testTTL) },
		conformance.FailoverHooks{
			Fail: func(t testing.TB) {
				leader, err := c.WaitLeader(10 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				killed = leader
				c.Kill(leader)
				t.Logf("killed leader member %d", leader)
			},
			Heal: func(t testing.TB) {
				if err := c.Restart(killed); err != nil {
					t.Fatal(err)
				}
			},
		})
}
