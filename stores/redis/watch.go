package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
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

// Watch implements [driver.Driver].
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
	w := s.newWatcher(ks, prefix, nil)
	if err := s.register(w); err != nil {
		return nil, err
	}
	last, snap, err := s.snapshot(ctx, ks, prefix)
	if err != nil {
		s.unregister(w)
		return nil, err
	}
	return s.start(ctx, w, last, snap), nil
}

// subscribeWait bounds how long WatchKeys waits for the subscriber to
// confirm its keys' channels.
const subscribeWait = 2 * subBackoffMax

// WatchKeys implements [spate.KeyWatcher].
//
// Every write script also publishes its change on the key's own shard
// channel (keyChannel; the job's hash tag puts it in the job's slot). A
// key watch registers with the Store's subscriber (see hub), which
// subscribes to the channels of the keys its watches want, several per
// SSUBSCRIBE, counting the watches of each channel; once the server has
// confirmed every channel of the watch, one script reads the listed keys
// with the keyspace's last revision (the snapshot). So the server sends
// this client only the listed keys' changes, and a change after the
// snapshot is always heard. Without a log of its own keys, a watch that
// may have missed a notification (the subscriber reconnected, its buffer
// overflowed, a notification was unreadable) ends with a Retryable
// [spate.WatchError]: the consumer re-watches and re-reads its keys only.
// When the ACL user may not publish or subscribe (see [PushCommands]), a
// key watch reads the keyspace's change log once a second instead, as a
// prefix watch does, and keeps only its keys' changes.
func (s *store) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	w := s.newWatcher(ks, keys[0], keys)
	if err := s.register(w); err != nil {
		return nil, err
	}
	if err := s.awaitSubscribed(ctx, w); err != nil {
		s.unregister(w)
		return nil, err
	}
	last, snap, err := s.snapshotKeys(ctx, ks, keys)
	if err != nil {
		s.unregister(w)
		return nil, err
	}
	for k := range w.keys {
		w.keys[k] = last
	}
	return s.start(ctx, w, last, snap), nil
}

func (s *store) newWatcher(ks spate.Keyspace, prefix string, keys []string) *watcher {
	w := &watcher{
		s: s, ks: int(ks) - 1, log: s.space(ks).log, prefix: prefix, op: "watch",
		wake:  make(chan struct{}, 1),
		limit: min(watchBatch, int(s.opts.ChangeLogLength)),
	}
	if keys != nil {
		w.op = "watch-keys"
		w.keys = make(map[string]uint64, len(keys))
		for _, k := range keys {
			w.keys[k] = 0
		}
		w.ready = make(chan struct{})
	}
	return w
}

// keyChannel is the shard channel that the write scripts publish key's
// changes on besides the keyspace's (see mint in scripts.go).
func (s *store) keyChannel(ks int, key string) string { return s.ks[ks].log + ":" + key }

// awaitSubscribed waits until the server has confirmed the subscription of
// every channel of the key watch w, so that the snapshot read next misses
// no change. A watch that reads the log does not wait.
func (s *store) awaitSubscribed(ctx context.Context, w *watcher) error {
	if w.ready == nil {
		return nil
	}
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		return wrapErr(ctx.Err())
	case <-s.ctx.Done():
		return driver.ClosedError(driverName)
	case <-t.C:
		return fmt.Errorf("the subscriber did not confirm the keys' channels within %v: %w", subscribeWait, spate.ErrRetryable)
	}
}

// start runs w: it sends the snapshot, then the changes after last.
func (s *store) start(ctx context.Context, w *watcher, last uint64, snap []spate.Entry) <-chan spate.WatchEvent {
	out := make(chan spate.WatchEvent)
	w.out = out
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
	return out
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

// hub is a Store's one subscriber connection, shared by all its watches.
// It runs from the first watch until Close and always holds the anchor
// channel, which nothing publishes on; besides it, it holds the channels
// its watches want: a keyspace's channel while a prefix watch of it is
// open, a key's channel while a key watch of the key is open. It hands
// each notification to the watches of its channel.
type hub struct {
	mu      sync.Mutex
	running bool
	// subs are the channels wanted or still being let go, by name.
	subs map[string]*sub
	// ps is the live subscriber connection, nil while there is none.
	ps *goredis.PubSub
	// retry (capacity 1) ends the subscriber's wait to resubscribe: a
	// watch opened, so the server may be back.
	retry chan struct{}
	// polling: the ACL denies publishing or subscribing (found at startup
	// or by the subscriber); watches read the change log once a second.
	polling bool
}

// sub is one channel of the hub. SSUBSCRIBE and SUNSUBSCRIBE replies come
// back in the order sent, one per channel, so counting the commands in
// flight tells when the state of the last one sent is the server's.
type sub struct {
	keyspace bool // a keyspace's channel (prefix watches), not a key's
	watchers map[*watcher]struct{}
	sent     bool // the last command sent on ps for it was SSUBSCRIBE
	inflight int  // commands sent on ps whose reply has not come
	on       bool // subscribed on ps: confirmed, nothing in flight
}

// subscribeChunk is the most channels one SSUBSCRIBE names.
const subscribeChunk = 512

// register adds w to the hub, starting the subscriber if it is not running.
func (s *store) register(w *watcher) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return driver.ClosedError(driverName)
	}
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[string]*sub{}
	}
	w.native = w.keys != nil && !h.polling
	switch {
	case w.keys == nil:
		w.chans = []string{w.log}
	case w.native:
		w.chans = make([]string, 0, len(w.keys))
		for k := range w.keys {
			w.chans = append(w.chans, s.keyChannel(w.ks, k))
		}
	default:
		// A key watch that reads the log holds no channel.
		w.ready = nil
	}
	for _, ch := range w.chans {
		sb := h.subs[ch]
		if sb == nil {
			sb = &sub{keyspace: w.keys == nil, watchers: map[*watcher]struct{}{}}
			h.subs[ch] = sb
		}
		sb.watchers[w] = struct{}{}
		if w.native && !sb.on {
			w.pending++
		}
	}
	h.sync(s.ctx, w.chans)
	if w.native {
		w.waiting = true
		h.readyIfDone(w)
	}
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
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ch := range w.chans {
		if sb := h.subs[ch]; sb != nil {
			delete(sb.watchers, w)
		}
	}
	h.sync(s.ctx, w.chans)
}

// readyIfDone ends w's wait for its channels once none is pending.
func (h *hub) readyIfDone(w *watcher) {
	if w.waiting && w.pending == 0 {
		w.waiting = false
		close(w.ready)
	}
}

// sync brings the subscription of chans on ps in line with their watches:
// SSUBSCRIBE the wanted ones not sent, SUNSUBSCRIBE the others, and forget
// a channel nobody wants once its replies are in. h.mu is held.
func (h *hub) sync(ctx context.Context, chans []string) {
	var on, off []string
	for _, ch := range chans {
		sb := h.subs[ch]
		if sb == nil {
			continue
		}
		want := len(sb.watchers) > 0
		switch {
		case h.ps != nil && want && !sb.sent:
			on = append(on, ch)
			sb.sent = true
			sb.inflight++
			sb.on = false
		case h.ps != nil && !want && sb.sent:
			off = append(off, ch)
			sb.sent = false
			sb.inflight++
			sb.on = false
		case !want && sb.inflight == 0 && !sb.sent:
			delete(h.subs, ch)
		}
	}
	var err error
	for c := range slices.Chunk(on, subscribeChunk) {
		if err == nil {
			err = h.ps.SSubscribe(ctx, c...)
		}
	}
	for c := range slices.Chunk(off, subscribeChunk) {
		if err == nil {
			err = h.ps.SUnsubscribe(ctx, c...)
		}
	}
	if err != nil {
		// The connection broke: closing it ends serve, and the next
		// connection subscribes to every wanted channel afresh.
		_ = h.ps.Close()
	}
}

// reset starts the bookkeeping of a new connection ps (nil: none): nothing
// is subscribed, every key watch still waiting waits for all its
// channels, and with ps every wanted channel is subscribed to.
func (h *hub) reset(ctx context.Context, ps *goredis.PubSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ps = ps
	chans := make([]string, 0, len(h.subs))
	for ch, sb := range h.subs {
		sb.sent, sb.inflight, sb.on = false, 0, false
		chans = append(chans, ch)
		for w := range sb.watchers {
			if w.waiting {
				w.pending = len(w.chans)
			}
		}
	}
	h.sync(ctx, chans)
}

// reply accounts for the server's reply to a subscription command. It
// reports false when the server dropped a channel on its own (its slot
// moved).
func (h *hub) reply(m *goredis.Subscription) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb := h.subs[m.Channel]
	if sb == nil || sb.inflight == 0 {
		return m.Kind == "ssubscribe" || sb == nil || !sb.on
	}
	sb.inflight--
	if sb.inflight > 0 {
		return true
	}
	sb.on = m.Kind == "ssubscribe"
	if !sb.on {
		if len(sb.watchers) == 0 && !sb.sent {
			delete(h.subs, m.Channel)
		}
		return true
	}
	for w := range sb.watchers {
		switch {
		case sb.keyspace:
			// Changes before this confirmation were not heard.
			w.push(nil)
		case w.waiting:
			w.pending--
			h.readyIfDone(w)
		}
	}
	return true
}

// fanOut hands c to every watch of channel ch.
func (h *hub) fanOut(ch string, c *change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sb := h.subs[ch]; sb != nil {
		for w := range sb.watchers {
			if !w.waiting {
				w.push(c)
			}
		}
	}
}

// staleAll tells every watch that notifications may have been lost: a
// prefix watch reads the log, a key watch ends. A key watch still waiting
// for its channels is not told; it waits for the next connection's.
func (h *hub) staleAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, sb := range h.subs {
		for w := range sb.watchers {
			if !w.waiting {
				w.push(nil)
			}
		}
	}
}

// poll makes the hub poll for good: the key watches still waiting for
// their channels read the change log instead.
func (h *hub) poll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.polling = true
	for _, sb := range h.subs {
		for w := range sb.watchers {
			if w.waiting {
				w.native = false
				w.waiting = false
				close(w.ready)
			}
		}
	}
}

// subscribe runs the subscriber until Close, resubscribing on a fresh
// connection whenever one breaks. After any break every watch reads the
// log or, if it is a key watch, ends.
func (s *store) subscribe() {
	defer s.wg.Done()
	s.hub.mu.Lock()
	retry := s.hub.retry
	s.hub.mu.Unlock()
	backoff := watchPoll
	failing := false
	for s.ctx.Err() == nil {
		ps := s.c.SSubscribe(s.ctx, s.anchor)
		stop := context.AfterFunc(s.ctx, func() { _ = ps.Close() })
		s.hub.reset(s.ctx, ps)
		confirmed, err := s.serve(ps)
		stop()
		s.hub.reset(s.ctx, nil)
		_ = ps.Close()
		s.hub.staleAll()
		if s.ctx.Err() != nil {
			return
		}
		if err != nil && errorCode(err.Error()) == "NOPERM" {
			s.log.Warn(fmt.Sprintf("the ACL user may not use the job's channels (grant +%s; the push commands are %s, on the channels &spate:*); "+
				"watches read the change log once a second instead of hearing of changes", deniedCommand(err.Error(), "ssubscribe"), strings.Join(PushCommands, ", ")), "err", err)
			s.hub.poll()
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
func (s *store) serve(ps *goredis.PubSub) (confirmed bool, err error) {
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
				// Probe the connection by subscribing to the anchor
				// again, which the server confirms: PING would need a
				// command the ACL user may lack (not in PushCommands),
				// and its NOPERM would turn every watch to polling.
				if err := ps.SSubscribe(s.ctx, s.anchor); err != nil {
					return confirmed, err
				}
				continue
			}
			return confirmed, err
		}
		silent = 0
		switch m := msg.(type) {
		case *goredis.Subscription:
			if m.Channel == s.anchor {
				if m.Kind != "ssubscribe" {
					return confirmed, fmt.Errorf("the server ended the subscription to %s (%s)", m.Channel, m.Kind)
				}
				confirmed = true
				continue
			}
			if !s.hub.reply(m) {
				// The server dropped the channel (its slot moved).
				return confirmed, fmt.Errorf("the server ended the subscription to %s (%s)", m.Channel, m.Kind)
			}
		case *goredis.Message:
			c, err := notice(m.Payload)
			if err != nil {
				s.log.Warn("ignoring a notification; watches read the change log (or key watches end) instead",
					"channel", m.Channel, "err", err)
				c = nil
			}
			s.hub.fanOut(m.Channel, c)
		}
	}
}

// watcher is one watch: of a prefix (keys nil), or of a set of keys.
type watcher struct {
	s      *store
	ctx    context.Context
	out    chan<- spate.WatchEvent
	ks     int // keyspace index
	log    string
	prefix string // a key watch's first key, for errors
	op     string // "watch" or "watch-keys", for errors
	limit  int    // most changes buffered
	last   uint64 // revision of the last change delivered (run); a native key watch's snapshot

	// keys of a key watch: the last revision delivered of each (run).
	keys map[string]uint64
	// chans are the hub channels of the watch.
	chans []string

	// Guarded by the hub's mu. native: a key watch that hears of its
	// keys' changes on their channels, not from the log. waiting: it waits
	// for pending of its channels to be confirmed; ready is closed then.
	native  bool
	waiting bool
	pending int
	ready   chan struct{}

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
	w.send(spate.WatchEvent{Kind: spate.WatchError, Err: driver.OpError(driverName, w.op, spate.Keyspace(w.ks+1), w.prefix, err)})
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
		if w.native {
			// A key watch has no log of its keys to read.
			if stale {
				w.fail(fmt.Errorf("notifications of the keys may have been lost (the subscriber reconnected or this watch fell behind); re-watch: %w",
					spate.ErrRetryable))
				return
			}
			for _, c := range queue {
				if !w.deliverKey(c) {
					return
				}
			}
			continue
		}
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
	if w.keys != nil {
		if _, ok := w.keys[c.key]; !ok {
			return true
		}
	} else if !strings.HasPrefix(c.key, w.prefix) {
		return true
	}
	return w.forward(c)
}

// deliverKey forwards a native key watch's notification unless the
// snapshot or an earlier notification covered it.
func (w *watcher) deliverKey(c *change) bool {
	last, ok := w.keys[c.key]
	if !ok || c.rev <= last {
		return true
	}
	w.keys[c.key] = c.rev
	return w.forward(c)
}

func (w *watcher) forward(c *change) bool {
	if c.op == 'p' {
		return w.send(spate.WatchEvent{Kind: spate.WatchPut, Key: c.key, Value: []byte(c.value), Revision: c.rev})
	}
	return w.send(spate.WatchEvent{Kind: spate.WatchDelete, Key: c.key, Revision: c.rev})
}
