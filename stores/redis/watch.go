package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
)

const (
	// watchPoll is how often an idle watch reads the change log on its own,
	// in case a notification was lost, and how often an idle subscriber probes its connection.
	watchPoll = time.Second
	// watchQueueBytes caps the changes one watch buffers from notifications
	// (the entry cap is the smaller of watchBatch and ChangeLogLength). A
	// watch over either cap drops its buffer and reads the change log.
	watchQueueBytes = 4 << 20
	// subBackoffMax caps the wait between attempts to resubscribe; a new
	// watch cuts the wait short.
	subBackoffMax = 5 * time.Second
)

// Watch implements [spate.Driver].
//
// One script reads the live keys under prefix together with the keyspace's
// last revision. Every write script publishes its change on the keyspace's
// shard channel; one subscriber connection per Store (see hub) hands each
// change to every watch of that keyspace, so an open watch holds no pooled
// connection and costs the server no read per write. The change log stays
// the source of truth: a watch reads it (non-blocking XREAD from its last
// revision) whenever a notification skips a revision, when the subscriber
// reconnects or drops its buffer, and once a second while it hears nothing,
// so a lost notification delays an event but never loses it. The watch is
// registered with the subscriber before the snapshot is read, so every
// change after the snapshot either reaches it as a notification or shows up
// in one of those reads. Log entry IDs are the revisions themselves, so a
// jump in the IDs read means the log was trimmed past this watcher: it gets
// a Retryable [spate.WatchError] and re-watches, as it does when a read
// fails.
func (s *store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	out := make(chan spate.WatchEvent)
	w := &watcher{
		s: s, out: out, ks: int(ks) - 1, log: s.space(ks).log, prefix: prefix,
		wake:  make(chan struct{}, 1),
		limit: min(watchBatch, int(s.opts.ChangeLogLength)),
	}
	if err := s.register(w); err != nil {
		return nil, err
	}
	last, snap, err := s.snapshot(ctx, ks, prefix)
	if err != nil {
		s.unregister(w)
		return nil, err
	}
	w.last = last
	// The portable layer calls Close only after this call returned, so the
	// store cannot be closing here.
	s.wg.Add(1)

	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	w.ctx = wctx
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer s.unregister(w)
		defer stop()
		defer cancel()
		w.run(snap)
	}()
	return out, nil
}

// change is one change-log entry, from a notification or a log read.
type change struct {
	rev   uint64
	op    byte // 'p' put, 'd' delete
	key   string
	value string
}

// notice decodes a notification: "<rev> p <len(key)> <key><value>" or
// "<rev> d <len(key)> <key>".
func notice(payload string) (*change, error) {
	bad := fmt.Errorf("malformed notification %.64q", payload)
	rev, rest, ok := strings.Cut(payload, " ")
	if !ok || len(rest) < 2 || rest[1] != ' ' || (rest[0] != 'p' && rest[0] != 'd') {
		return nil, bad
	}
	c := &change{op: rest[0]}
	n, rest, ok := strings.Cut(rest[2:], " ")
	if !ok {
		return nil, bad
	}
	klen, err := strconv.Atoi(n)
	if err != nil || klen < 0 || klen > len(rest) {
		return nil, bad
	}
	if c.rev, err = strconv.ParseUint(rev, 10, 64); err != nil {
		return nil, bad
	}
	c.key, c.value = rest[:klen], rest[klen:]
	if c.op == 'd' && c.value != "" {
		return nil, bad
	}
	return c, nil
}

// hub is a Store's one subscriber connection, shared by all its watches:
// it subscribes to both keyspaces' channels when the first watch opens and
// fans each notification out to the watches of its keyspace, until Close.
type hub struct {
	mu       sync.Mutex
	running  bool
	watchers [2]map[*watcher]struct{}
	// retry (capacity 1) ends the subscriber's wait to resubscribe: a
	// watch opened, so the server may be back.
	retry chan struct{}
	// polling: the ACL denies publishing or subscribing (found at startup
	// or by the subscriber); watches read the change log once a second.
	polling bool
}

// register adds w to the hub, starting the subscriber if it is not running.
func (s *store) register(w *watcher) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return spate.ClosedError(driver)
	}
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers[w.ks] == nil {
		h.watchers[w.ks] = map[*watcher]struct{}{}
	}
	h.watchers[w.ks][w] = struct{}{}
	if !h.running && !h.polling {
		h.running = true
		h.retry = make(chan struct{}, 1)
		s.wg.Add(1)
		go s.subscribe()
	}
	select {
	case h.retry <- struct{}{}:
	default:
	}
	return nil
}

func (s *store) unregister(w *watcher) {
	s.hub.mu.Lock()
	delete(s.hub.watchers[w.ks], w)
	s.hub.mu.Unlock()
}

// fanOut hands c to every watch of keyspace ks, or, with c nil, tells them
// to read the log because notifications may have been lost.
func (h *hub) fanOut(ks int, c *change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers[ks] {
		w.push(c)
	}
}

func (h *hub) staleAll() {
	h.fanOut(0, nil)
	h.fanOut(1, nil)
}

// subscribe runs the subscriber until Close, resubscribing on a fresh
// connection whenever one breaks. After any break every watch reads the log.
func (s *store) subscribe() {
	defer s.wg.Done()
	chans := []string{s.ks[0].log, s.ks[1].log}
	s.hub.mu.Lock()
	retry := s.hub.retry
	s.hub.mu.Unlock()
	backoff := watchPoll
	failing := false
	for s.ctx.Err() == nil {
		ps := s.c.SSubscribe(s.ctx, chans...)
		stop := context.AfterFunc(s.ctx, func() { _ = ps.Close() })
		confirmed, err := s.serve(ps, chans)
		stop()
		_ = ps.Close()
		s.hub.staleAll()
		if s.ctx.Err() != nil {
			return
		}
		if err != nil && errorCode(err.Error()) == "NOPERM" {
			s.log.Warn("the ACL user may not subscribe to the job's channels (grant +ssubscribe and &spate:*); "+
				"watches read the change log once a second instead of hearing of changes", "err", err)
			s.hub.mu.Lock()
			s.hub.polling = true
			s.hub.mu.Unlock()
			return
		}
		if confirmed {
			backoff = watchPoll
		}
		if !failing || confirmed {
			s.log.Warn("watch subscriber lost its connection; watches read the change log every second until it is back",
				"err", err)
		}
		failing = !confirmed
		// Drain a retry left over from before the break.
		select {
		case <-retry:
		default:
		}
		t := time.NewTimer(backoff)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-retry:
			t.Stop()
		}
		backoff = min(2*backoff, subBackoffMax)
	}
}

// serve reads ps until it breaks or the store closes. It reports whether
// the subscription was confirmed.
func (s *store) serve(ps *goredis.PubSub, chans []string) (confirmed bool, err error) {
	ksOf := func(ch string) int {
		if ch == chans[0] {
			return 0
		}
		if ch == chans[1] {
			return 1
		}
		return -1
	}
	silent := 0
	for {
		msg, err := ps.ReceiveTimeout(s.ctx, watchPoll)
		if err != nil {
			if s.ctx.Err() != nil {
				return confirmed, err
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && silent < 2 {
				silent++
				// Probe the connection by subscribing to the first
				// channel again, which the server confirms: PING would
				// need a command the ACL user may lack (not in
				// PushCommands), and its NOPERM would turn every watch
				// to polling.
				if err := ps.SSubscribe(s.ctx, chans[0]); err != nil {
					return confirmed, err
				}
				continue
			}
			return confirmed, err
		}
		silent = 0
		switch m := msg.(type) {
		case *goredis.Subscription:
			ks := ksOf(m.Channel)
			switch {
			case ks < 0:
			case m.Kind == "ssubscribe":
				// Changes before this confirmation were not heard.
				confirmed = true
				s.hub.fanOut(ks, nil)
			default:
				// The server dropped the channel (its slot moved).
				return confirmed, fmt.Errorf("the server ended the subscription to %s (%s)", m.Channel, m.Kind)
			}
		case *goredis.Message:
			ks := ksOf(m.Channel)
			if ks < 0 {
				continue
			}
			c, err := notice(m.Payload)
			if err != nil {
				s.log.Warn("ignoring a notification; watches read the change log instead", "channel", m.Channel, "err", err)
				c = nil
			}
			s.hub.fanOut(ks, c)
		}
	}
}

type watcher struct {
	s      *store
	ctx    context.Context
	out    chan<- spate.WatchEvent
	ks     int // keyspace index
	log    string
	prefix string
	limit  int    // most changes buffered
	last   uint64 // revision of the last change delivered (run)

	wake chan struct{} // capacity 1: something was pushed

	mu     sync.Mutex
	queue  []*change // notifications not yet delivered
	bytes  int
	stale  bool // notifications may have been lost: read the log
	pushed bool // a notification arrived since run last looked
}

// push buffers c, or with c nil marks the watch stale; it never blocks.
func (w *watcher) push(c *change) {
	w.mu.Lock()
	switch {
	case c == nil:
		w.stale = true
	case w.stale:
		// The log read that comes next covers c.
	case len(w.queue) >= w.limit || w.bytes+len(c.value) > watchQueueBytes:
		w.queue, w.bytes, w.stale = nil, 0, true
	default:
		w.queue = append(w.queue, c)
		w.bytes += len(c.value)
	}
	if c != nil {
		w.pushed = true
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
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
	w.send(spate.WatchEvent{Kind: spate.WatchError, Err: spate.OpError(driver, "watch", spate.Keyspace(w.ks+1), w.prefix, err)})
}

// run sends the snapshot, SnapshotDone, then the changes after it.
func (w *watcher) run(snap []spate.Entry) {
	for _, e := range snap {
		if !w.send(spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}) {
			return
		}
	}
	if !w.send(spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
		return
	}
	poll := time.NewTicker(watchPoll)
	defer poll.Stop()
	for {
		tick := false
		select {
		case <-w.ctx.Done():
			return
		case <-w.wake:
		case <-poll.C:
			tick = true
		}
		w.mu.Lock()
		queue, stale, heard := w.queue, w.stale, w.pushed
		w.queue, w.bytes, w.stale = nil, 0, false
		if tick {
			w.pushed = false
		}
		w.mu.Unlock()
		// On a tick, read the log only if nothing was heard for a whole
		// period: while notifications flow, a lost one shows as a gap.
		if stale || (tick && !heard) {
			if !w.catchUp() {
				return
			}
		}
		for _, c := range queue {
			if c.rev <= w.last {
				continue // already read from the log
			}
			if c.rev != w.last+1 {
				if !w.catchUp() {
					return
				}
				if c.rev <= w.last {
					continue
				}
				if c.rev != w.last+1 {
					w.fail(fmt.Errorf("heard of revision %d but the change log ends at %d: %w",
						c.rev, w.last, spate.ErrRetryable))
					return
				}
			}
			if !w.deliver(c) {
				return
			}
		}
	}
}

// catchUp reads the change log after the last delivered revision to its
// end, without blocking.
func (w *watcher) catchUp() bool {
	for {
		streams, err := w.s.c.XRead(w.ctx, &goredis.XReadArgs{
			Streams: []string{w.log, strconv.FormatUint(w.last, 10) + "-0"},
			Count:   watchBatch,
			Block:   -1,
		}).Result()
		if w.ctx.Err() != nil {
			return false // cancelled or closed: the stream just ends
		}
		if errors.Is(err, goredis.Nil) {
			return true
		}
		if err != nil {
			w.fail(fmt.Errorf("reading the change log: %w: %w", err, classOf(err)))
			return false
		}
		n := 0
		for _, st := range streams {
			for _, m := range st.Messages {
				n++
				c, err := w.entry(m)
				if err != nil {
					w.fail(err)
					return false
				}
				if !w.deliver(c) {
					return false
				}
			}
		}
		if n < watchBatch {
			return true
		}
	}
}

// entry decodes a change-log entry.
func (w *watcher) entry(m goredis.XMessage) (*change, error) {
	id, _, _ := strings.Cut(m.ID, "-")
	rev, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("change log entry %q has a foreign ID: %w", m.ID, spate.ErrFatal)
	}
	key, _ := m.Values["k"].(string)
	op, _ := m.Values["o"].(string)
	value, _ := m.Values["v"].(string)
	if op != "p" && op != "d" {
		return nil, fmt.Errorf("change log entry %s has unknown op %q: %w", m.ID, op, spate.ErrFatal)
	}
	return &change{rev: rev, op: op[0], key: key, value: value}, nil
}

// deliver checks that c is the next revision and forwards it if its key is
// under the prefix.
func (w *watcher) deliver(c *change) bool {
	if c.rev != w.last+1 {
		w.fail(fmt.Errorf("the change log was trimmed past this watcher (next change %d, log resumes at %d; raise ChangeLogLength if this recurs): %w",
			w.last+1, c.rev, spate.ErrRetryable))
		return false
	}
	w.last = c.rev
	if !strings.HasPrefix(c.key, w.prefix) {
		return true
	}
	if c.op == 'p' {
		return w.send(spate.WatchEvent{Kind: spate.WatchPut, Key: c.key, Value: []byte(c.value), Revision: c.rev})
	}
	return w.send(spate.WatchEvent{Kind: spate.WatchDelete, Key: c.key, Revision: c.rev})
}
