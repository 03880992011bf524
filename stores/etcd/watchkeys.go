package etcd

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
)

// txnGets is how many Gets one transaction of a key watch's snapshot holds
// at first: etcd's default --max-txn-ops. A server that allows fewer
// answers ErrTooManyOps, and the snapshot halves its transactions.
const txnGets = 128

var _ spate.KeyWatcher = (*store)(nil)

// WatchKeys implements [spate.KeyWatcher] natively: etcd sends this watcher
// the events of the listed keys only. It reads the keys at one revision R
// (transactions of Gets, the later ones pinned to R), delivers the live
// ones as the snapshot, then SnapshotDone, then the events of one etcd
// watch per key from R+1, merged by one goroutine per 32 keys. The watches
// share the stream's context, so clientv3 multiplexes them onto one gRPC
// stream.
//
// The stream's rules and its ends are those of [store.Watch]: one key's
// events arrive in revision order (different keys' may interleave), an
// expiry arrives as a delete at the revocation's revision, and a compacted
// start revision, a watch the server cancels, any key's channel closing or
// a consumer more than Options.WatchBuffer events behind ends the stream
// with a Retryable [spate.WatchError].
//
// keys arrive from the portable layer sorted, unique and valid, 1 to
// [spate.MaxWatchKeys] of them.
func (s *store) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	kvs, rev, err := s.getKeys(ctx, ks, keys)
	if err != nil {
		return nil, s.classify(ctx, err)
	}
	return s.stream(ctx, ks, "watch-keys", keys[0], kvs, func(wctx context.Context) clientv3.WatchChan {
		if len(keys) == 1 {
			return s.cli.Watch(wctx, s.key(ks, keys[0]), clientv3.WithRev(rev+1))
		}
		return s.watchEach(wctx, ks, keys, rev+1)
	}), nil
}

// getKeys reads keys at one revision, which it returns: the live ones'
// key-values, in the order of keys. It reads them in transactions of Gets,
// txnGets at a time (fewer if the server refuses that many); every
// transaction after the first reads at the first one's revision.
func (s *store) getKeys(ctx context.Context, ks spate.Keyspace, keys []string) ([]*mvccpb.KeyValue, int64, error) {
	var (
		kvs   []*mvccpb.KeyValue
		rev   int64
		batch = txnGets
	)
	for len(keys) > 0 {
		n := min(batch, len(keys))
		ops := make([]clientv3.Op, n)
		for i, k := range keys[:n] {
			if rev == 0 {
				ops[i] = clientv3.OpGet(s.key(ks, k))
			} else {
				ops[i] = clientv3.OpGet(s.key(ks, k), clientv3.WithRev(rev))
			}
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			if n > 1 && errors.Is(err, rpctypes.ErrTooManyOps) {
				batch = n / 2
				continue
			}
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil {
				kvs = append(kvs, rr.Kvs...)
			}
		}
		keys = keys[n:]
	}
	return kvs, rev, nil
}

// mergeChunk is how many keys' watch channels one merging goroutine
// selects over. A select's cost grows with its cases (reflect.Select locks
// every channel and allocates a receive buffer per case: about 0.25 µs and
// 190 bytes a case, measured), so one goroutine over all 1024 keys would
// spend some 270 µs per event; one per key would cost a goroutine per key
// on top of clientv3's own. 32 keys a goroutine keeps both small: about
// 8 µs per event, and 32 goroutines at MaxWatchKeys.
const mergeChunk = 32

// watchEach opens one etcd watch per key from rev and merges their
// responses into the channel it returns, one goroutine per mergeChunk keys
// selecting over their channels, so each key's responses keep their order.
// Each merging goroutine opens its keys' watches itself, one server round
// trip each (clientv3 registers a stream's watches one at a time), so the
// snapshot flows meanwhile; what a watch sends in the meantime waits in
// clientv3's buffer. When any key's channel closes (after its last
// response, an error, has been passed on) or ctx ends, every merging
// goroutine stops, their watches are cancelled and the channel closes: a
// watch that ends ends the stream.
func (s *store) watchEach(ctx context.Context, ks spate.Keyspace, keys []string, rev int64) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse)
	// mctx carries ctx's metadata, so the watches share one gRPC stream.
	mctx, cancel := context.WithCancel(ctx)
	var merging sync.WaitGroup
	for chunk := range slices.Chunk(keys, mergeChunk) {
		merging.Go(func() {
			defer cancel() // one merger's end is every merger's
			cases := make([]reflect.SelectCase, 1, len(chunk)+1)
			cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(mctx.Done())}
			for _, k := range chunk {
				if mctx.Err() != nil {
					return // do not register watches that would be cancelled at once
				}
				wch := s.cli.Watch(mctx, s.key(ks, k), clientv3.WithRev(rev))
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(wch)})
			}
			for {
				i, v, ok := reflect.Select(cases)
				if i == 0 || !ok {
					return
				}
				select {
				case out <- v.Interface().(clientv3.WatchResponse):
				case <-mctx.Done():
					return
				}
			}
		})
	}
	s.wg.Go(func() {
		merging.Wait()
		cancel()
		close(out)
	})
	return out
}
