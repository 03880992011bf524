package etcd_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/casload"
	"github.com/spate-go/spate/internal/etcdservers"
)

// TestFailoverKeepsCASLinearizable runs compare-and-swap increments from
// several clients on a 3-member cluster while the raft leader is killed
// (and later restarted). Every operation is recorded; the history must be
// linearizable (porcupine, per-key compare-and-swap register model) and the
// counter must hold every won increment: a failover may fail calls
// (Retryable, outcome unknown) but never loses or duplicates an
// acknowledged write.
func TestFailoverKeepsCASLinearizable(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{Members: 3})
	h := c.NewHarness(t, testTTL)
	ctx := t.Context()

	const (
		clients = 4
		total   = 120 // won increments before the clients stop
		stuck   = 30 * time.Second
	)
	stores := make([]spate.Store, clients)
	for i := range stores {
		s, err := h.NewStore(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	rec := &conformance.History{}
	o, err := conformance.Recorder{H: rec, Client: 0, Store: stores[0]}.Create(ctx, spate.Durable, casload.Key, []byte("0"))
	require.NoError(t, err)
	require.True(t, o.Won)
	leader, err := c.WaitLeader(10 * time.Second)
	require.NoError(t, err)

	// Kill the leader once a third of the work is done, bring it back at
	// two thirds: the clients keep going throughout.
	load := casload.Start(t, ctx, rec, stores)
	load.WaitWon(total/3, stuck, "before the kill")
	killedAt := time.Now()
	c.Kill(leader)
	t.Logf("killed leader m%d after %d won increments", leader, load.Won())
	next, err := c.WaitLeader(10 * time.Second)
	require.NoError(t, err)
	t.Logf("m%d leads %v after the kill", next, time.Since(killedAt).Round(time.Millisecond))
	load.WaitWon(2*total/3, stuck, "after killing the leader")
	require.NoError(t, c.Restart(leader))
	t.Logf("restarted m%d after %d won increments", leader, load.Won())
	load.WaitWon(total, stuck, "after restarting the old leader")
	load.Stop()

	en, ok, err := stores[0].Get(ctx, spate.Durable, casload.Key)
	require.NoError(t, err)
	require.True(t, ok)
	final, _ := strconv.Atoi(string(en.Value))
	t.Logf("%d won increments, %d updates with unknown outcome, %d failed reads; counter reads %d; %d operations recorded; first win %v after the kill",
		load.Won(), load.Unknown(), load.Failed(), final, rec.Len(), load.FirstWinAfter(killedAt).Round(time.Millisecond))
	load.CheckFinal(final)
	ok, info := rec.Check(60 * time.Second)
	require.True(t, ok, "create/get/update stay linearizable across leader failover: %s", info)
	if info != "" {
		t.Logf("porcupine: %s", info)
	}
}
