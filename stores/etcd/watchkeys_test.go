package etcd_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
)

// watchKeys opens a key watch on s, which must have the capability.
func watchKeys(t testing.TB, ctx context.Context, s spate.Store, ks spate.Keyspace, keys []string) <-chan spate.WatchEvent {
	t.Helper()
	kw, ok := spate.KeyWatcherOf(s)
	require.True(t, ok, "the etcd store has the KeyWatcher capability")
	ch, err := kw.WatchKeys(ctx, ks, keys)
	require.NoError(t, err)
	return ch
}

func keyNames(format string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(format, i)
	}
	return keys
}

// TestWatchKeysSnapshotIsAtOneRevision: on a server whose --max-txn-ops is
// 4, a key watch of 10 keys reads its snapshot in transactions of at most
// 4 Gets (halving from 128 on the server's refusal), all at the first
// one's revision. A writer rewrites all 10 keys in one transaction, again
// and again, meanwhile: every snapshot must hold one value for all 10.
func TestWatchKeysSnapshotIsAtOneRevision(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{MaxTxnOps: 4})
	prefix := etcdservers.FreshPrefix()
	s, err := etcd.New(t.Context(), c.Client(t, nil), opts(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	keys := keyNames("one.k%d", 10)

	raw := c.Client(t, nil)
	// Round i writes i to k0..k3, then k4..k7, then k8..k9, a transaction
	// each (the server allows no more than 4 operations in one), so at any
	// one revision the values, in key order, never go up and differ by at
	// most 1: a snapshot whose later batches read at later revisions would
	// see later keys ahead of earlier ones.
	writeRound := func(i int) error {
		for from := 0; from < len(keys); from += 4 {
			var ops []clientv3.Op
			for _, k := range keys[from:min(from+4, len(keys))] {
				ops = append(ops, clientv3.OpPut(prefix+"durable/"+k, strconv.Itoa(i)))
			}
			if _, err := raw.Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
		}
		return nil
	}
	require.NoError(t, writeRound(0))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			assert.NoError(t, writeRound(i))
		}
	})
	defer func() { close(stop); wg.Wait() }()

	for range 20 {
		wctx, cancel := context.WithCancel(ctx)
		ch := watchKeys(t, wctx, s, spate.Durable, append(keys, "one.absent"))
		var vals []int
		var revs []uint64
		for {
			ev := recv(t, ch, 10*time.Second, "the snapshot")
			if ev.Kind == spate.WatchSnapshotDone {
				break
			}
			require.Equal(t, spate.WatchPut, ev.Kind)
			v, err := strconv.Atoi(string(ev.Value))
			require.NoError(t, err)
			vals, revs = append(vals, v), append(revs, ev.Revision)
		}
		cancel()
		require.Len(t, vals, len(keys), "every live listed key, none absent")
		for i := 1; i < len(vals); i++ {
			require.LessOrEqual(t, vals[i], vals[i-1],
				"the snapshot reads every batch at one revision: values %v (revisions %v)", vals, revs)
			require.LessOrEqual(t, vals[i-1]-vals[i], 1, "values %v", vals)
		}
	}
}

// TestWatchKeysCompactionBreaksRetryable: as
// TestCompactionBreaksWatchRetryable, for a key watch of several keys (on
// a cluster of its own: compaction would break other tests' watches).
func TestWatchKeysCompactionBreaksRetryable(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	proxy := etcdservers.NewProxy(t, c.Members()[0].ClientURL.Host)
	prefix := etcdservers.FreshPrefix()
	ctx := t.Context()
	watcher := openOn(t, c, prefix, func(cfg *clientv3.Config) { cfg.Endpoints = []string{"http://" + proxy.Addr()} })
	writer := openOn(t, c, prefix, nil)

	keys := keyNames("cmp.k%d", 5)
	ch := watchKeys(t, ctx, watcher, spate.Durable, keys)
	snapshotDone(t, ch)
	o, err := writer.Create(ctx, spate.Durable, keys[2], []byte("0"))
	require.NoError(t, err)
	ev := recv(t, ch, 10*time.Second, "the create")
	require.Equal(t, o.Revision, ev.Revision)

	proxy.Block()
	rev := o.Revision
	for i := 1; i <= 5; i++ {
		u, err := writer.Update(ctx, spate.Durable, keys[2], []byte(fmt.Sprint(i)), rev)
		require.NoError(t, err)
		require.True(t, u.Won)
		rev = u.Revision
	}
	_, err = c.Client(t, nil).Compact(ctx, int64(rev))
	require.NoError(t, err)
	proxy.Unblock()

	for {
		ev := recv(t, ch, 30*time.Second, "the compaction error")
		if ev.Kind == spate.WatchError {
			requireRetryable(t, ev.Err, "compact", "watch-keys")
			break
		}
		require.Equal(t, spate.WatchPut, ev.Kind)
		require.Equal(t, keys[2], ev.Key)
		require.Greater(t, ev.Revision, o.Revision)
	}
	select {
	case _, ok := <-ch:
		require.False(t, ok, "the error is the last event")
	case <-time.After(10 * time.Second):
		t.Fatal("the key watch's channel stays open after its error")
	}
}

// TestWatchKeysSlowWatcherIsCutRetryable: as TestSlowWatcherIsCutRetryable,
// for a key watch: the merged events of several keys count against one
// WatchBuffer.
func TestWatchKeysSlowWatcherIsCutRetryable(t *testing.T) {
	t.Parallel()
	o := opts(etcdservers.FreshPrefix())
	o.WatchBuffer = 3
	s, err := etcd.New(t.Context(), etcdservers.Shared(t).Client(t, nil), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	lagged := make(chan struct{}, 1)
	etcd.SetLagHook(s, func() { lagged <- struct{}{} })
	ctx := t.Context()
	keys := keyNames("lag.k%d", 10)
	ch := watchKeys(t, ctx, s, spate.Durable, keys)
	for _, k := range keys { // never read meanwhile
		_, err := s.Create(ctx, spate.Durable, k, []byte("v"))
		require.NoError(t, err)
	}
	select {
	case <-lagged:
	case <-time.After(10 * time.Second):
		t.Fatal("a key watcher 10 events behind with a buffer of 3 was not cut")
	}
	ev := recv(t, ch, 10*time.Second, "the lag error")
	require.Equal(t, spate.WatchError, ev.Kind, "what was queued is dropped; the error comes first")
	requireRetryable(t, ev.Err, "behind", "watch-keys")
	_, ok := <-ch
	require.False(t, ok, "the error is the last event")
}

// TestWatchKeysCost logs what key watches of 1, 200 and MaxWatchKeys keys
// cost the client: the goroutines each adds (clientv3 runs one per etcd
// watch, the first watch of a client opens its gRPC stream, the driver
// runs one per 32 keys and two more) and how long until SnapshotDone and
// until a change of its last key arrives.
func TestWatchKeysCost(t *testing.T) {
	s := open(t, etcdservers.FreshPrefix(), nil)
	ctx := t.Context()
	for _, n := range []int{1, 200, spate.MaxWatchKeys} {
		keys := keyNames("cost.k%04d", n)
		before := runtime.NumGoroutine()
		start := time.Now()
		wctx, cancel := context.WithCancel(ctx)
		ch := watchKeys(t, wctx, s, spate.Durable, keys)
		snapshotDone(t, ch)
		snap := time.Since(start)
		o, err := s.Create(ctx, spate.Durable, keys[n-1], []byte("v"))
		require.NoError(t, err)
		ev := recv(t, ch, 10*time.Second, "the last key's create")
		require.Equal(t, o.Revision, ev.Revision)
		ready := time.Since(start)
		added := runtime.NumGoroutine() - before
		cancel()
		// Cancelled, the watch leaves nothing per key behind: clientv3's
		// per-watch goroutines and the driver's end. The client's gRPC
		// watch stream (7 goroutines, client and server side) may stay
		// open for the client's next watch.
		require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+10 }, 10*time.Second, 10*time.Millisecond,
			"%d keys: goroutines after cancel: %d, before the watch: %d", n, runtime.NumGoroutine(), before)
		_, err = s.Delete(ctx, spate.Durable, keys[n-1], spate.AnyRevision)
		require.NoError(t, err)
		t.Logf("%4d keys: SnapshotDone after %v, last key's change after %v, %d goroutines added",
			n, snap.Round(time.Microsecond), ready.Round(time.Microsecond), added)
	}
}

// BenchmarkWatchKeysEvent measures one change of a listed key reaching a
// key watch of 1, 200 and MaxWatchKeys keys: the write, the server's
// fan-out and the driver's merge (selects over at most 33 channels).
func BenchmarkWatchKeysEvent(b *testing.B) {
	for _, n := range []int{1, 200, spate.MaxWatchKeys} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			c := etcdservers.Shared(b)
			s, err := etcd.New(b.Context(), c.Client(b, nil), opts(etcdservers.FreshPrefix()))
			require.NoError(b, err)
			b.Cleanup(func() { _ = s.Close() })
			keys := keyNames("bench.k%04d", n)
			ch := watchKeys(b, b.Context(), s, spate.Durable, keys)
			for ev := range ch {
				if ev.Kind == spate.WatchSnapshotDone {
					break
				}
			}
			revs := make([]uint64, n)
			b.ResetTimer()
			for i := range b.N {
				j := (i * 7) % n
				var o spate.Outcome
				if revs[j] == 0 {
					o, err = s.Create(b.Context(), spate.Durable, keys[j], []byte("v"))
				} else {
					o, err = s.Update(b.Context(), spate.Durable, keys[j], []byte("v"), revs[j])
				}
				if err != nil || !o.Won {
					b.Fatalf("write: won=%t err=%v", o.Won, err)
				}
				revs[j] = o.Revision
				for ev := range ch {
					if ev.Kind == spate.WatchError {
						b.Fatal(ev.Err)
					}
					if ev.Revision == o.Revision {
						break
					}
				}
			}
		})
	}
}

// wireEvents counts the watch events a client receives over gRPC, before
// clientv3 or the driver sees them.
type wireEvents struct{ n atomic.Int64 }

func (w *wireEvents) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &countingStream{ClientStream: cs, w: w}, nil
}

type countingStream struct {
	grpc.ClientStream
	w *wireEvents
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if wr, ok := m.(*etcdserverpb.WatchResponse); ok && err == nil {
		s.w.n.Add(int64(len(wr.Events)))
	}
	return err
}

// TestWatchKeysIsNative: the server itself filters a key watch. Over the
// wire, the client receives only the listed keys' events (one live put),
// although 300 changes of unlisted keys, some extending a listed key's
// bytes ("wk.a0", "wk.a.1"), were written while the watch was open. A
// driver that watched a common prefix and filtered on the client would
// receive them all.
func TestWatchKeysIsNative(t *testing.T) {
	var wire wireEvents
	prefix := etcdservers.FreshPrefix()
	s := open(t, prefix, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithStreamInterceptor(wire.interceptor))
	})
	ctx := t.Context()
	raw := etcdservers.Shared(t).Client(t, nil)
	unlisted := func(round int) {
		for i := range 300 {
			k := fmt.Sprintf("wk.a%03d", i)
			if i%2 == 1 {
				k = fmt.Sprintf("wk.a.%03d", i)
			}
			_, err := raw.Put(ctx, prefix+"durable/"+k, strconv.Itoa(round))
			require.NoError(t, err)
		}
	}
	unlisted(0)
	for _, k := range []string{"wk.a", "wk.b"} {
		o, err := s.Create(ctx, spate.Durable, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
	}
	ch := watchKeys(t, ctx, s, spate.Durable, []string{"wk.b", "wk.a"})
	snap := 0
	for ev := recv(t, ch, 10*time.Second, "the snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, 10*time.Second, "the snapshot") {
		require.Equal(t, spate.WatchPut, ev.Kind)
		snap++
	}
	require.Equal(t, 2, snap)
	require.Zero(t, wire.n.Load(), "the snapshot is read, not watched")

	unlisted(1)
	en, ok, err := s.Get(ctx, spate.Durable, "wk.a")
	require.NoError(t, err)
	require.True(t, ok)
	o, err := s.Update(ctx, spate.Durable, "wk.a", []byte("v2"), en.Revision)
	require.NoError(t, err)
	require.True(t, o.Won)
	ev := recv(t, ch, 10*time.Second, "the live put of wk.a")
	require.Equal(t, spate.WatchPut, ev.Kind)
	require.Equal(t, "wk.a", ev.Key)
	require.Equal(t, o.Revision, ev.Revision)
	assert.Equal(t, int64(1), wire.n.Load(), "events received over the wire")
}
