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
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestFailoverCASIsLinearizable runs compare-and-swap increments of one
// durable counter from several clients on a 3-node R3 cluster with file
// storage and sync_interval always, stops the durable stream's leader
// mid-run and restarts it, and requires the recorded history to be
// linearizable (porcupine) and every won increment to be in the final
// value.
func TestFailoverCASIsLinearizable(t *testing.T) {
	c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
	h := c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3})
	ctx := testCtx(t, 3*time.Minute)
	const clients = 4
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
	o, err := conformance.RecordCreate(ctx, rec, 0, stores[0], spate.Durable, "ctr", []byte("0"))
	require.NoError(t, err, "create the counter")
	require.True(t, o.Won, "create the counter: won=%t", o.Won)
	c.WaitStreamReplicasCurrent(t, admin, stream, 3)
	leader := c.StreamLeader(t, admin, stream)

	// A watcher follows the counter through the failover, re-watching when
	// its stream breaks.
	watcher := stores[0]
	var seen atomic.Uint64
	var watchBreaks atomic.Int64
	seenCh := make(chan struct{}, 1)
	watchStop := make(chan struct{})
	watchCtx, watchCancel := context.WithCancel(ctx)
	defer watchCancel()
	var watchWG sync.WaitGroup
	watchWG.Go(func() {
		for {
			select {
			case <-watchStop:
				return
			default:
			}
			wctx, wcancel := context.WithCancel(watchCtx)
			ch, err := watcher.Watch(wctx, spate.Durable, "ctr")
			if err != nil {
				wcancel()
				if !assert.True(t, spate.IsRetryable(err), "re-watch during a failover must fail Retryable: %v", err) {
					return
				}
				watchBreaks.Add(1)
				backoff(watchStop)
				continue
			}
			var last uint64
			for ev := range ch {
				switch ev.Kind {
				case spate.WatchPut:
					assert.Greater(t, ev.Revision, last, "rule: a key's events arrive in revision order; %d after %d", ev.Revision, last)
					last = ev.Revision
					if ev.Revision > seen.Load() {
						seen.Store(ev.Revision)
					}
					select {
					case seenCh <- struct{}{}:
					default:
					}
				case spate.WatchError:
					assert.True(t, spate.IsRetryable(ev.Err), "a broken watch is Retryable: %v", ev.Err)
					watchBreaks.Add(1)
				case spate.WatchDelete:
					t.Errorf("the counter is never deleted; the watch reported a delete at %d", ev.Revision)
				}
			}
			wcancel()
		}
	})

	var won, unknown atomic.Int64
	var firstWinAfterKill atomic.Int64 // unix nanos
	var killedAt atomic.Int64
	progress := make(chan struct{}, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range clients {
		wg.Go(func() {
			s := stores[cl]
			for {
				select {
				case <-stop:
					return
				default:
				}
				opCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
				en, ok, err := conformance.RecordGet(opCtx, rec, cl, s, spate.Durable, "ctr")
				if err != nil || !ok {
					cancel()
					if err == nil {
						t.Errorf("client %d: the counter vanished", cl)
						return
					}
					if !assert.True(t, spate.IsRetryable(err), "client %d: a failover error must be Retryable: %v", cl, err) {
						return
					}
					backoff(stop)
					continue
				}
				v, err := strconv.Atoi(string(en.Value))
				if !assert.NoError(t, err, "client %d: counter value %q", cl, en.Value) {
					cancel()
					return
				}
				o, err := conformance.RecordUpdate(opCtx, rec, cl, s, spate.Durable, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
				cancel()
				switch {
				case err != nil:
					unknown.Add(1)
					if !assert.True(t, spate.IsRetryable(err), "client %d: a failover error must be Retryable: %v", cl, err) {
						return
					}
					backoff(stop)
				case o.Won:
					won.Add(1)
					if killedAt.Load() != 0 {
						firstWinAfterKill.CompareAndSwap(0, time.Now().UnixNano())
					}
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	waitWon := func(target int64, what string) {
		t.Helper()
		for won.Load() < target {
			select {
			case <-progress:
			case <-time.After(30 * time.Second):
				close(stop)
				wg.Wait()
				t.Fatalf("%s: stuck at %d won increments (want %d)", what, won.Load(), target)
			}
		}
	}
	waitWon(40, "before the failover")
	wonAtKill := won.Load()
	killedAt.Store(time.Now().UnixNano())
	c.Nodes[leader].Shutdown()
	waitWon(wonAtKill+40, "after stopping the stream leader "+c.Nodes[leader].Name())
	newLeader := c.StreamLeader(t, admin, stream)
	assert.NotEqual(t, leader, newLeader, "the stopped node %s still leads %s", c.Nodes[leader].Name(), stream)
	c.Nodes[leader].Restart(t)
	c.WaitStreamReplicasCurrent(t, admin, stream, 3)
	waitWon(won.Load()+40, "after restarting "+c.Nodes[leader].Name())
	close(stop)
	wg.Wait()

	var final spate.Entry
	for {
		en, ok, err := conformance.RecordGet(ctx, rec, clients, stores[0], spate.Durable, "ctr")
		if err == nil && ok {
			final = en
			break
		}
		if ctx.Err() != nil || err == nil {
			t.Fatalf("final read: ok=%t err=%v", ok, err)
		}
		backoff(nil)
	}
	for seen.Load() < final.Revision {
		select {
		case <-seenCh:
		case <-time.After(30 * time.Second):
			t.Errorf("rule: a watch carries every key's latest revision; the watcher is stuck at %d, the counter is at %d", seen.Load(), final.Revision)
			seen.Store(final.Revision)
		}
	}
	close(watchStop)
	watchCancel()
	watchWG.Wait()
	v, _ := strconv.Atoi(string(final.Value))
	w, u := won.Load(), unknown.Load()
	assert.GreaterOrEqual(t, int64(v), w, "rule: no won increment is lost across a failover; counter reads %d after %d won and %d unknown increments", v, w, u)
	assert.LessOrEqual(t, int64(v), w+u, "rule: no won increment is lost across a failover; counter reads %d after %d won and %d unknown increments", v, w, u)
	ok, info := rec.Check(2 * time.Minute)
	assert.True(t, ok, "rule: create, get and update stay linearizable across a leader failover; porcupine: ok=%t %s (%d operations)", ok, info, rec.Len())
	assert.Empty(t, info, "rule: create, get and update stay linearizable across a leader failover; porcupine: ok=%t %s (%d operations)", ok, info, rec.Len())
	gap := time.Duration(firstWinAfterKill.Load() - killedAt.Load())
	t.Logf("stopped stream leader %s; new leader %s; %d operations, %d won, %d unknown, final counter %d; first won increment %v after the stop; the watcher broke %d times",
		c.Nodes[leader].Name(), c.Nodes[newLeader].Name(), rec.Len(), w, u, v, gap.Round(time.Millisecond), watchBreaks.Load())
}

// backoff pauses a client after a failed operation (not a wait for a
// condition: the failover has no event a client could wait on).
func backoff(stop <-chan struct{}) {
	select {
	case <-stop:
	case <-time.After(50 * time.Millisecond):
	}
}
