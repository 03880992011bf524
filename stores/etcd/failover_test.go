package etcd_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
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
		clients   = 4
		perClient = 30 // won increments each client makes
		opTimeout = 2 * time.Second
	)
	stores := make([]spate.Store, clients)
	for i := range stores {
		s, err := h.NewStore(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	rec := &conformance.History{}
	o, err := conformance.RecordCreate(ctx, rec, 0, stores[0], spate.Durable, "ctr", []byte("0"))
	require.NoError(t, err)
	require.True(t, o.Won)
	leader, err := c.WaitLeader(10 * time.Second)
	require.NoError(t, err)

	var (
		won, unknown, failed atomic.Int64
		progress             = make(chan struct{}, clients*perClient)
		wg                   sync.WaitGroup
		deadline             = time.Now().Add(90 * time.Second)
	)
	for id := range clients {
		wg.Go(func() {
			s := stores[id]
			for done := 0; done < perClient && time.Now().Before(deadline); {
				gctx, cancel := context.WithTimeout(ctx, opTimeout)
				en, ok, err := conformance.RecordGet(gctx, rec, id, s, spate.Durable, "ctr")
				cancel()
				if err != nil {
					failed.Add(1)
					if !spate.IsRetryable(err) {
						t.Errorf("a failover error is Retryable; get returned %v", err)
						return
					}
					continue
				}
				if !ok {
					t.Errorf("the counter disappeared")
					return
				}
				v, _ := strconv.Atoi(string(en.Value))
				uctx, cancel := context.WithTimeout(ctx, opTimeout)
				u, err := conformance.RecordUpdate(uctx, rec, id, s, spate.Durable, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
				cancel()
				switch {
				case err != nil:
					unknown.Add(1)
					if !spate.IsRetryable(err) {
						t.Errorf("a failover error is Retryable; update returned %v", err)
						return
					}
				case u.Won:
					won.Add(1)
					done++
					progress <- struct{}{}
				}
			}
		})
	}

	// Kill the leader once a third of the work is done, bring it back at
	// two thirds: the clients keep going throughout.
	total := clients * perClient
	waitWon := func(n int) {
		for int(won.Load()) < n && time.Now().Before(deadline) {
			select {
			case <-progress:
			case <-time.After(time.Second):
			}
		}
	}
	waitWon(total / 3)
	killedAt := time.Now()
	c.Kill(leader)
	t.Logf("killed leader m%d after %d won increments", leader, won.Load())
	next, err := c.WaitLeader(10 * time.Second)
	require.NoError(t, err)
	t.Logf("m%d leads %v after the kill", next, time.Since(killedAt).Round(time.Millisecond))
	waitWon(2 * total / 3)
	require.NoError(t, c.Restart(leader))
	t.Logf("restarted m%d after %d won increments", leader, won.Load())
	wg.Wait()

	require.EqualValues(t, total, won.Load(), "every client finishes its increments before the deadline")
	en, ok, err := stores[0].Get(ctx, spate.Durable, "ctr")
	require.NoError(t, err)
	require.True(t, ok)
	final, _ := strconv.Atoi(string(en.Value))
	t.Logf("%d won increments, %d updates with unknown outcome, %d failed reads; counter reads %d; %d operations recorded",
		won.Load(), unknown.Load(), failed.Load(), final, rec.Len())
	require.GreaterOrEqual(t, int64(final), won.Load(), "no won increment is lost across the failover")
	require.LessOrEqual(t, int64(final), won.Load()+unknown.Load(), "only won or unknown updates can have applied")
	ok, info := rec.Check(60 * time.Second)
	require.True(t, ok, "create/get/update stay linearizable across leader failover: %s", info)
	if info != "" {
		t.Logf("porcupine: %s", info)
	}
}
