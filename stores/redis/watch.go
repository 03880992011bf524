package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
)

// Watch implements [spate.Driver].
//
// One script reads the live keys under prefix together with the keyspace's
// last revision; the watch then reads the change log from that revision on
// with XREAD BLOCK, so no change falls between the snapshot and the live
// stream. The log holds every change of the keyspace, and the watch filters
// by prefix on the client. Log entry IDs are the revisions themselves, one
// per revision, so a jump in the IDs means the log was trimmed past this
// watcher: it gets a Retryable [spate.WatchError] and re-watches, as it does
// when the connection breaks.
func (s *store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	last, snap, err := s.snapshot(ctx, ks, prefix)
	if err != nil {
		return nil, err
	}
	s.wg.Add(2)

	// Two goroutines: the reader blocks in XREAD, which go-redis cannot
	// interrupt, for up to watchBlock; the forwarder owns the channel and
	// closes it as soon as the watch is cancelled or the store closed. The
	// reader then exits at the end of its current XREAD; Close waits for it.
	out := make(chan spate.WatchEvent)
	batches := make(chan xbatch)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	w := &watcher{s: s, ctx: wctx, out: out, log: s.space(ks).log, ks: ks, prefix: prefix, last: last}
	go func() {
		defer s.wg.Done()
		w.read(last, batches)
	}()
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer stop()
		defer cancel()
		w.forward(snap, batches)
	}()
	return out, nil
}

// xbatch is one XREAD's result, or the error that ended the reading.
type xbatch struct {
	msgs []goredis.XMessage
	err  error
}

type watcher struct {
	s      *store
	ctx    context.Context
	out    chan<- spate.WatchEvent
	log    string
	ks     spate.Keyspace
	prefix string
	last   uint64 // revision of the last log entry delivered (forwarder)
}

// read reads the change log after revision from, passing batches on until
// the watch ends or a read fails (which it passes on last).
func (w *watcher) read(from uint64, batches chan<- xbatch) {
	pass := func(b xbatch) bool {
		select {
		case batches <- b:
			return true
		case <-w.ctx.Done():
			return false
		}
	}
	for {
		streams, err := w.s.c.XRead(w.ctx, &goredis.XReadArgs{
			Streams: []string{w.log, strconv.FormatUint(from, 10) + "-0"},
			Count:   watchBatch,
			Block:   watchBlock,
		}).Result()
		if w.ctx.Err() != nil {
			return // cancelled or closed: the stream just ends
		}
		if errors.Is(err, goredis.Nil) {
			continue // blocked for watchBlock with nothing new
		}
		if err != nil {
			pass(xbatch{err: fmt.Errorf("reading the change log: %w: %w", err, classOf(err))})
			return
		}
		var msgs []goredis.XMessage
		for _, st := range streams {
			msgs = append(msgs, st.Messages...)
		}
		if len(msgs) == 0 {
			continue
		}
		id, _, _ := strings.Cut(msgs[len(msgs)-1].ID, "-")
		next, perr := strconv.ParseUint(id, 10, 64)
		if perr != nil {
			next = from // deliver reports the foreign ID
		}
		if !pass(xbatch{msgs: msgs}) || perr != nil {
			return
		}
		from = next
	}
}

func (w *watcher) send(ev spate.WatchEvent) bool {
	select {
	case w.out <- ev:
		return true
	case <-w.ctx.Done():
		return false
	}
}

func (w *watcher) fail(err error) {
	w.send(spate.WatchEvent{Kind: spate.WatchError, Err: spate.OpError(driver, "watch", w.ks, w.prefix, err)})
}

// forward sends the snapshot, SnapshotDone, then the reader's batches.
func (w *watcher) forward(snap []spate.Entry, batches <-chan xbatch) {
	for _, e := range snap {
		if !w.send(spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}) {
			return
		}
	}
	if !w.send(spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
		return
	}
	for {
		var b xbatch
		select {
		case b = <-batches:
		case <-w.ctx.Done():
			return
		}
		if b.err != nil {
			w.fail(b.err)
			return
		}
		for _, m := range b.msgs {
			if !w.deliver(m) {
				return
			}
		}
	}
}

// deliver checks that m is the next revision and forwards it if its key is
// under the prefix.
func (w *watcher) deliver(m goredis.XMessage) bool {
	id, _, _ := strings.Cut(m.ID, "-")
	rev, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		w.fail(fmt.Errorf("change log entry %q has a foreign ID: %w", m.ID, spate.ErrFatal))
		return false
	}
	if rev != w.last+1 {
		w.fail(fmt.Errorf("the change log was trimmed past this watcher (next change %d, log resumes at %d; raise ChangeLogLength if this recurs): %w",
			w.last+1, rev, spate.ErrRetryable))
		return false
	}
	w.last = rev
	key, _ := m.Values["k"].(string)
	if !strings.HasPrefix(key, w.prefix) {
		return true
	}
	switch op, _ := m.Values["o"].(string); op {
	case "p":
		value, _ := m.Values["v"].(string)
		return w.send(spate.WatchEvent{Kind: spate.WatchPut, Key: key, Value: []byte(value), Revision: rev})
	case "d":
		return w.send(spate.WatchEvent{Kind: spate.WatchDelete, Key: key, Revision: rev})
	default:
		w.fail(fmt.Errorf("change log entry %s has unknown op %q: %w", m.ID, op, spate.ErrFatal))
		return false
	}
}
