package etcd

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// Watch implements [driver.Driver]. It lists the prefix at one revision R (the
// snapshot), then opens an etcd watch from R+1, so every change after the
// listing arrives and none falls between. Events carry the ModRevision of
// the change; a delete (explicit, or a lease expiring) carries the delete's
// revision.
//
// The watch requires a leader: if the member the client talks to loses its
// leader, the stream ends with a Retryable error instead of stalling. A
// watch whose start revision has been compacted, a stream the server
// cancels, a channel that closes and a consumer more than
// Options.WatchBuffer events behind all end the stream with a Retryable
// [spate.WatchError]. A permission revoked mid-stream ends it Fatal.
func (s *store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	kvs, rev, err := s.rangeAll(ctx, ks, prefix)
	if err != nil {
		return nil, s.classify(ctx, err)
	}
	return s.stream(ctx, ks, "watch", prefix, kvs, func(wctx context.Context) clientv3.WatchChan {
		return s.cli.Watch(wctx, s.key(ks, prefix), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	}), nil
}

// stream starts the goroutine that feeds a watch's output: the snapshot,
// SnapshotDone, then the events of the etcd watch that open starts (from the
// revision after the snapshot's) under the stream's own context, which
// requires a leader and ends with ctx, with Close, or when the stream ends.
// op and label name the watch in its errors.
func (s *store) stream(ctx context.Context, ks spate.Keyspace, op, label string, snapshot []*mvccpb.KeyValue,
	open func(wctx context.Context) clientv3.WatchChan) <-chan spate.WatchEvent {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	s.wg.Add(1)
	stop := context.AfterFunc(s.ctx, cancel) // Close ends the watch
	wch := open(wctx)
	out := make(chan spate.WatchEvent)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		defer stop()
		s.runWatch(wctx, ks, op, label, snapshot, wch, out)
	}()
	return out
}

// runWatch feeds out from a queue: the snapshot, SnapshotDone, then live
// events as etcd delivers them. It keeps draining etcd's channel while the
// consumer is slow, so etcd's client never buffers without bound; the queue
// is bounded by Options.WatchBuffer instead.
func (s *store) runWatch(ctx context.Context, ks spate.Keyspace, op, label string, snapshot []*mvccpb.KeyValue,
	wch clientv3.WatchChan, out chan<- spate.WatchEvent) {
	queue := make([]spate.WatchEvent, 0, len(snapshot)+1)
	for _, kv := range snapshot {
		if k, ok := s.storeKey(ks, kv.Key); ok {
			queue = append(queue, spate.WatchEvent{Kind: spate.WatchPut, Key: k, Value: value(kv), Revision: uint64(kv.ModRevision)})
		}
	}
	queue = append(queue, spate.WatchEvent{Kind: spate.WatchSnapshotDone})
	fromSnapshot := len(queue)  // queued events that belong to the snapshot
	var final *spate.WatchEvent // the error that ends the stream, sent after the queue
	fail := func(err error) {
		final = &spate.WatchEvent{Kind: spate.WatchError, Err: driver.OpError("etcd", op, ks, label, err)}
	}
	for {
		var (
			send chan<- spate.WatchEvent
			next spate.WatchEvent
			recv = wch
		)
		switch {
		case len(queue) > 0:
			send, next = out, queue[0]
		case final != nil:
			send, next = out, *final
		}
		if final != nil {
			recv = nil // the stream is over; deliver what is queued, then the error
		}
		select {
		case <-ctx.Done():
			return
		case send <- next:
			if len(queue) == 0 {
				return // that was the final error
			}
			queue = queue[1:]
			fromSnapshot = max(fromSnapshot-1, 0)
		case resp, ok := <-recv:
			switch {
			case !ok:
				if ctx.Err() != nil {
					return
				}
				fail(fmt.Errorf("the etcd watch channel closed: %w", spate.ErrRetryable))
			case resp.CompactRevision != 0:
				fail(s.classify(ctx, fmt.Errorf(
					"the watch fell behind compaction (compacted through revision %d); re-watch: %w", resp.CompactRevision, resp.Err())))
			case resp.Err() != nil:
				fail(s.classify(ctx, resp.Err()))
			case resp.Canceled:
				fail(fmt.Errorf("cancelled by the server: %w", spate.ErrRetryable))
			default:
				for _, ev := range resp.Events {
					k, ok := s.storeKey(ks, ev.Kv.Key)
					if !ok {
						continue
					}
					we := spate.WatchEvent{Kind: spate.WatchPut, Key: k, Value: value(ev.Kv), Revision: uint64(ev.Kv.ModRevision)}
					if ev.Type == mvccpb.DELETE {
						we = spate.WatchEvent{Kind: spate.WatchDelete, Key: k, Revision: uint64(ev.Kv.ModRevision)}
					}
					queue = append(queue, we)
				}
				if len(queue)-fromSnapshot > s.opts.WatchBuffer {
					queue = nil
					fail(fmt.Errorf("the consumer fell more than %d events behind: %w",
						s.opts.WatchBuffer, spate.ErrRetryable))
					if s.lagHook != nil {
						s.lagHook()
					}
				}
			}
		}
	}
}
