package nats_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/casload"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestFailoverCASIsLinearizable runs compare-and-swap increments of one
// durable counter from several clients on a 3-node R3 cluster with file
// storage and sync_interval always, stops the durable stream's leader
// mid-run and restarts it, and requires the recorded history to be
// linearizable (porcupine), every won increment to be in the final value,
// and a watcher to follow the counter through the failover.
func TestFailoverCASIsLinearizable(t *testing.T) {
	t.Parallel()
	c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
	h := c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3})
	ctx := testCtx(t, 3*time.Minute)
	const (
		clients = 4
		stuck   = 30 * time.Second
	)
	stores := make([]spate.Store, clients)
	for i := range stores {
		s, err := h.NewStore(ctx)
		require.NoError(t, err, "open store %d", i)
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	admin, err := h.Conn()
	require.NoError(t, err)
	dname, _ := spatenats.Buckets(h.Options().Job)
	stream := "KV_" + dname

	rec := &conformance.History{}
	o, err := conformance.Recorder{H: rec, Client: 0, Store: stores[0]}.Create(ctx, spate.Durable, casload.Key, []byte("0"))
	require.NoError(t, err, "create the counter")
	require.True(t, o.Won, "create the counter: won=%t", o.Won)
	c.WaitStreamReplicasCurrent(t, admin, stream, 3)
	leader := c.StreamLeader(t, admin, stream)

	w := followCounter(t, ctx, stores[0])
	load := casload.Start(t, ctx, rec, stores)
	load.WaitWon(40, stuck, "before the failover")
	killedAt := time.Now()
	c.Nodes[leader].Shutdown()
	load.WaitWon(load.Won()+40, stuck, "after stopping the stream leader "+c.Nodes[leader].Name())
	newLeader := c.StreamLeader(t, admin, stream)
	assert.NotEqual(t, leader, newLeader, "the stopped node %s still leads %s", c.Nodes[leader].Name(), stream)
	c.Nodes[leader].Restart(t)
	c.WaitStreamReplicasCurrent(t, admin, stream, 3)
	load.WaitWon(load.Won()+40, stuck, "after restarting "+c.Nodes[leader].Name())
	load.Stop()

	var final spate.Entry
	for {
		en, ok, err := conformance.Recorder{H: rec, Client: clients, Store: stores[0]}.Get(ctx, spate.Durable, casload.Key)
		if err == nil && ok {
			final = en
			break
		}
		if ctx.Err() != nil || err == nil {
			t.Fatalf("final read: ok=%t err=%v", ok, err)
		}
		backoff(nil)
	}
	w.waitSeen(final.Revision, stuck)
	w.stop()
	v, _ := strconv.Atoi(string(final.Value))
	load.CheckFinal(v)
	ok, info := rec.Check(2 * time.Minute)
	assert.True(t, ok, "rule: create, get and update stay linearizable across a leader failover; porcupine: ok=%t %s (%d operations)", ok, info, rec.Len())
	assert.Empty(t, info, "rule: create, get and update stay linearizable across a leader failover; porcupine: ok=%t %s (%d operations)", ok, info, rec.Len())
	t.Logf("stopped stream leader %s; new leader %s; %d operations, %d won, %d unknown, final counter %d; first won increment %v after the stop; the watcher broke %d times",
		c.Nodes[leader].Name(), c.Nodes[newLeader].Name(), rec.Len(), load.Won(), load.Unknown(), v,
		load.FirstWinAfter(killedAt).Round(time.Millisecond), w.breaks.Load())
}

// counterWatch follows the counter through a failover, re-watching when
// its stream breaks, and checks each stream's events on the way: in
// revision order, never a delete, every break Retryable.
type counterWatch struct {
	t      *testing.T
	seen   atomic.Uint64 // the highest revision seen
	seenCh chan struct{}
	breaks atomic.Int64
	done   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func followCounter(t *testing.T, ctx context.Context, s spate.Store) *counterWatch {
	w := &counterWatch{t: t, seenCh: make(chan struct{}, 1), done: make(chan struct{})}
	ctx, w.cancel = context.WithCancel(ctx)
	t.Cleanup(w.stop)
	w.wg.Go(func() {
		for {
			select {
			case <-w.done:
				return
			default:
			}
			if !w.follow(ctx, s) {
				return
			}
		}
	})
	return w
}

// follow reads one watch stream to its end; false stops the watcher.
func (w *counterWatch) follow(ctx context.Context, s spate.Store) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := s.Watch(wctx, spate.Durable, casload.Key)
	if err != nil {
		if !assert.True(w.t, spate.IsRetryable(err), "re-watch during a failover must fail Retryable: %v", err) {
			return false
		}
		w.breaks.Add(1)
		backoff(w.done)
		return true
	}
	var last uint64
	for ev := range ch {
		switch ev.Kind {
		case spate.WatchPut:
			assert.Greater(w.t, ev.Revision, last, "rule: a key's events arrive in revision order; %d after %d", ev.Revision, last)
			last = ev.Revision
			if ev.Revision > w.seen.Load() {
				w.seen.Store(ev.Revision)
			}
			select {
			case w.seenCh <- struct{}{}:
			default:
			}
		case spate.WatchError:
			assert.True(w.t, spate.IsRetryable(ev.Err), "a broken watch is Retryable: %v", ev.Err)
			w.breaks.Add(1)
		case spate.WatchDelete:
			w.t.Errorf("the counter is never deleted; the watch reported a delete at %d", ev.Revision)
		}
	}
	return true
}

// waitSeen requires the watcher to reach revision rev, each event within
// stuck of the last.
func (w *counterWatch) waitSeen(rev uint64, stuck time.Duration) {
	w.t.Helper()
	for w.seen.Load() < rev {
		select {
		case <-w.seenCh:
		case <-time.After(stuck):
			w.t.Errorf("rule: a watch carries every key's latest revision; the watcher is stuck at %d, the counter is at %d", w.seen.Load(), rev)
			return
		}
	}
}

func (w *counterWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.cancel()
	w.wg.Wait()
}

// backoff pauses after a failed operation (not a wait for a condition:
// the failover has no event a client could wait on).
func backoff(stop <-chan struct{}) {
	select {
	case <-stop:
	case <-time.After(50 * time.Millisecond):
	}
}
