// Package mem is the in-process coordination store: the reference driver of
// the [spate.Store] contract, for tests and for single-machine embedding
// (several coordinators in one process sharing one store).
//
// It keeps both keyspaces in memory behind one mutex. Each keyspace mints
// revisions from its own counter, so revisions strictly increase per key
// across delete and re-create. Ephemeral keys expire one TTL after their last
// write on the store's clock; expiry is applied lazily by every operation and
// eagerly by a timer set for the next deadline, so it is exact in real time
// and deterministic inside a testing/synctest bubble, where time is virtual.
// With an injected clock ([Options.Now]) the timer polls every
// [Options.SweepInterval] instead.
//
// It has the [spate.Releaser] capability: UpdateAndDelete makes both
// writes under that one mutex.
//
// It has the [spate.Sessioner] capability: a session is a deadline in the
// same expiry heap as the keys'. A key bound to it has no deadline of its
// own; when the session's deadline passes, the expiry that removes
// expired keys removes its keys, each with a delete to watchers. KeepAlive
// moves the deadline and writes nothing.
//
// Watches register under the same lock that mints revisions, so a watcher
// never sees a gap or an out-of-order pair. A watcher that falls more than
// [Options.WatchBuffer] events behind is cut off with a Retryable error and
// must re-watch, exactly as a real server drops a slow consumer.
//
// Several handles can share one store's data, like clients of one server:
// [Store.Connect] returns another handle whose Close ends only its own
// watches. Nothing is persisted: the data lives as long as the process.
//
// For tests, [Options.Faults] takes a [faultstore.Injector] that fails operations,
// lands writes but reports errors, adds latency and breaks watches.
package mem

import (
	"container/heap"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
	"github.com/spate-go/spate/faultstore"
)

// Defaults of [Options].
const (
	DefaultWatchBuffer   = 4096
	DefaultSweepInterval = 20 * time.Millisecond
)

// Options configure a store.
type Options struct {
	// TTL of the ephemeral keyspace. Required.
	TTL time.Duration
	// Now is the store's clock. nil means time.Now, which a testing/synctest
	// bubble virtualises. Inject a clock to control expiry by hand outside
	// a bubble; expiry then runs on every operation and every SweepInterval.
	Now func() time.Time
	// SweepInterval is the expiry polling period with an injected clock.
	// Default 20ms.
	SweepInterval time.Duration
	// WatchBuffer is how many live events a watcher may fall behind before
	// it is cut off with a Retryable error. Default 4096.
	WatchBuffer int
	// MaxValueSize caps values in bytes; 0 means no cap.
	MaxValueSize int
	// Faults, when set, injects faults into every operation.
	Faults *faultstore.Injector
}

// Store is a handle on an in-memory store. It is safe for concurrent use.
// The portable layer ([driver.PortableStore]) does the argument checks and
// the closed state; the handle below it does the rest.
type Store struct {
	*driver.PortableStore
	h *handle
}

var (
	_ spate.Store     = (*Store)(nil)
	_ spate.Releaser  = (*Store)(nil)
	_ spate.Releaser  = (*handle)(nil)
	_ spate.Sessioner = (*Store)(nil)
	_ spate.Sessioner = (*handle)(nil)
)

// New creates a store and returns its first handle.
func New(opts Options) (*Store, error) {
	if opts.TTL <= 0 {
		return nil, spate.Fatalf("mem: TTL must be positive, got %v", opts.TTL)
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = DefaultWatchBuffer
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	b := &backend{opts: opts, now: opts.Now}
	if b.now == nil {
		b.now = time.Now
	}
	for i := range b.ks {
		b.ks[i] = &keyspace{items: map[string]*item{}}
	}
	return b.connect(), nil
}

// MustNew is New that panics on a bad TTL; for examples and tests.
func MustNew(opts Options) *Store {
	s, err := New(opts)
	if err != nil {
		panic(err)
	}
	return s
}

// Connect returns a new handle on the same data, like a second client of
// one server. It fails with ErrClosed if this handle is closed.
func (s *Store) Connect() (*Store, error) {
	var c *Store
	err := s.Do("connect", func() error {
		c = s.h.b.connect()
		return nil
	})
	return c, err
}

// handle is one handle's [driver.Driver]: its watches over the shared data.
type handle struct {
	b *backend

	mu       sync.Mutex
	watchers map[*watcher]struct{}
}

// Capabilities implements [driver.Driver].
func (h *handle) Capabilities() spate.Capabilities {
	lat := time.Duration(0)
	if h.b.opts.Now != nil {
		lat = h.b.opts.SweepInterval
	}
	return spate.Capabilities{
		Driver:               "mem",
		TTL:                  h.b.opts.TTL,
		TTLFloor:             time.Nanosecond,
		ExpiryLatency:        lat,
		MaxValueSize:         h.b.opts.MaxValueSize,
		LinearizableFailover: true,
		Durability:           "none: data lives in this process's memory and is lost when it exits",
	}
}

// Close ends this handle's watches. The data stays available to other
// handles.
func (h *handle) Close() error {
	h.mu.Lock()
	ws := h.watchers
	h.watchers = nil
	h.mu.Unlock()
	for w := range ws {
		w.stop()
	}
	h.b.release()
	return nil
}

// Create implements [driver.Driver].
func (h *handle) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	var o spate.Outcome
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Create, Keyspace: ks, Key: key, Value: value}, func() error {
		o = h.b.put(ks, key, value, 0, true)
		return nil
	})
	return o, err
}

// Update implements [driver.Driver].
func (h *handle) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	var o spate.Outcome
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Update, Keyspace: ks, Key: key, Value: value}, func() error {
		o = h.b.put(ks, key, value, expected, false)
		return nil
	})
	return o, err
}

// UpdateAndDelete implements [spate.Releaser]: both writes under the
// backend's one lock, so no read or watcher sees one without the other.
// [Options.Faults] sees it as an Update of the durable key (a rule that
// fails the durable update fails the whole call).
func (h *handle) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	var u, d spate.Outcome
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Update, Keyspace: spate.Durable, Key: durableKey, Value: value}, func() error {
		u, d = h.b.updateAndDelete(durableKey, value, expected, ephemeralKey, leaseExpected)
		return nil
	})
	return u, d, err
}

// Get implements [driver.Driver].
func (h *handle) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	var (
		e  spate.Entry
		ok bool
	)
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Get, Keyspace: ks, Key: key}, func() error {
		e, ok = h.b.get(ks, key)
		return nil
	})
	return e, ok, err
}

// Delete implements [driver.Driver].
func (h *handle) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	var o spate.Outcome
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Delete, Keyspace: ks, Key: key}, func() error {
		o = h.b.del(ks, key, expected)
		return nil
	})
	return o, err
}

// List implements [driver.Driver].
func (h *handle) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	var es []spate.Entry
	err := h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.List, Keyspace: ks, Key: prefix}, func() error {
		es = h.b.list(ks, prefix)
		return nil
	})
	return es, err
}

// Watch implements [driver.Driver].
func (h *handle) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return h.b.opts.Faults.ApplyWatch(ctx, ks, prefix, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return h.watch(ctx, ks, prefix)
	})
}

// WatchKeys implements [spate.KeyWatcher]: the backend hands a key
// watcher only the events of its keys (an index by key, not a scan).
func (h *handle) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	return h.b.opts.Faults.ApplyWatch(ctx, ks, keys[0], func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return h.open(ctx, &watcher{ks: ks, prefix: keys[0], keys: keys})
	})
}

func (h *handle) watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return h.open(ctx, &watcher{ks: ks, prefix: prefix})
}

// open starts w, a prefix watcher or (keys set) a key watcher.
func (h *handle) open(ctx context.Context, w *watcher) (<-chan spate.WatchEvent, error) {
	w.limit = h.b.opts.WatchBuffer
	w.signal = make(chan struct{}, 1)
	w.done = make(chan struct{})
	w.out = make(chan spate.WatchEvent)
	h.mu.Lock()
	if h.watchers == nil {
		h.watchers = map[*watcher]struct{}{}
	}
	h.watchers[w] = struct{}{}
	h.mu.Unlock()

	snapshot := h.b.subscribe(w)
	go func() {
		defer func() {
			h.b.unsubscribe(w)
			h.mu.Lock()
			delete(h.watchers, w)
			h.mu.Unlock()
			close(w.out)
		}()
		w.run(ctx, snapshot)
	}()
	return w.out, nil
}

// backend is the data shared by every handle of one store.
type backend struct {
	opts Options
	now  func() time.Time

	mu       sync.Mutex
	ks       [2]*keyspace
	watchers map[*watcher]struct{} // prefix watchers
	// byKey indexes the key watchers of each keyspace by key.
	byKey   [2]map[string]map[*watcher]struct{}
	handles int
	timer   *time.Timer // expires the earliest deadline
	armed   bool
}

type keyspace struct {
	rev       uint64
	items     map[string]*item
	deadlines deadlineHeap
}

type item struct {
	value    []byte
	rev      uint64
	deadline time.Time // ephemeral only, and only while unbound
	sess     *session  // the session the key is bound to, or nil
}

// session is a lifetime that bound ephemeral keys share.
type session struct {
	deadline time.Time
	keys     map[string]struct{} // keys bound to it (some maybe since rebound)
	expired  bool                // its deadline passed: its keys are gone
	ended    bool                // closed
}

func (b *backend) connect() *Store {
	b.mu.Lock()
	b.handles++
	b.mu.Unlock()
	h := &handle{b: b}
	return &Store{PortableStore: driver.NewStore(h), h: h}
}

// release drops one handle; the last one stops the expiry timer.
func (b *backend) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handles--
	if b.handles == 0 && b.timer != nil {
		b.timer.Stop()
		b.armed = false
	}
}

func (b *backend) space(ks spate.Keyspace) *keyspace { return b.ks[ks-1] }

// put creates (create=true) or compare-and-swaps a key. Caller validated.
func (b *backend) put(ks spate.Keyspace, key string, value []byte, expected uint64, create bool) spate.Outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.putLocked(ks, key, value, expected, create, nil)
}

// updateAndDelete is the durable compare-and-swap and, if it wins, the
// guarded ephemeral delete, under one lock.
func (b *backend) updateAndDelete(durableKey string, value []byte, expected uint64, ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.putLocked(spate.Durable, durableKey, value, expected, false, nil)
	if !u.Won {
		return u, spate.Outcome{}
	}
	return u, b.delLocked(spate.Ephemeral, ephemeralKey, leaseExpected)
}

// putLocked writes key; with sess (ephemeral only) the key is bound to
// it, and without, it has a deadline of its own (a Store.Update of a
// bound key unbinds it).
func (b *backend) putLocked(ks spate.Keyspace, key string, value []byte, expected uint64, create bool, sess *session) spate.Outcome {
	sp := b.space(ks)
	now := b.now()
	b.expireLocked(ks, now)
	cur, exists := sp.items[key]
	if create && exists || !create && (!exists || cur.rev != expected) {
		return spate.Outcome{}
	}
	sp.rev++
	it := &item{value: slices.Clone(value), rev: sp.rev, sess: sess}
	sp.items[key] = it
	switch {
	case sess != nil:
		sess.keys[key] = struct{}{}
	case ks == spate.Ephemeral:
		it.deadline = now.Add(b.opts.TTL)
		heap.Push(&sp.deadlines, deadline{at: it.deadline, key: key, rev: it.rev})
		b.armLocked()
	}
	b.broadcastLocked(ks, spate.WatchEvent{Kind: spate.WatchPut, Key: key, Value: it.value, Revision: it.rev})
	return spate.Won(it.rev)
}

func (b *backend) get(ks spate.Keyspace, key string) (spate.Entry, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(ks, b.now())
	it, ok := b.space(ks).items[key]
	if !ok {
		return spate.Entry{}, false
	}
	return spate.Entry{Key: key, Value: slices.Clone(it.value), Revision: it.rev}, true
}

func (b *backend) del(ks spate.Keyspace, key string, expected uint64) spate.Outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.delLocked(ks, key, expected)
}

func (b *backend) delLocked(ks spate.Keyspace, key string, expected uint64) spate.Outcome {
	b.expireLocked(ks, b.now())
	sp := b.space(ks)
	cur, ok := sp.items[key]
	if !ok {
		if expected == spate.AnyRevision {
			return spate.Won(0) // vacuous
		}
		return spate.Outcome{}
	}
	if expected != spate.AnyRevision && cur.rev != expected {
		return spate.Outcome{}
	}
	return spate.Won(b.removeLocked(ks, key))
}

// removeLocked deletes a live key at a fresh revision and tells watchers.
func (b *backend) removeLocked(ks spate.Keyspace, key string) uint64 {
	sp := b.space(ks)
	delete(sp.items, key)
	sp.rev++
	b.broadcastLocked(ks, spate.WatchEvent{Kind: spate.WatchDelete, Key: key, Revision: sp.rev})
	return sp.rev
}

func (b *backend) list(ks spate.Keyspace, prefix string) []spate.Entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(ks, b.now())
	return b.snapshotLocked(ks, prefix)
}

func (b *backend) snapshotLocked(ks spate.Keyspace, prefix string) []spate.Entry {
	// The keys sorted, then their entries: a string sorts cheaper than
	// an entry; the values are copied into one allocation, each capped so
	// that an append to one cannot reach the next.
	items := b.space(ks).items
	var keys []string
	size := 0
	for k, it := range items {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
			size += len(it.value)
		}
	}
	slices.Sort(keys)
	es := make([]spate.Entry, len(keys))
	arena := make([]byte, 0, size)
	for i, k := range keys {
		it := items[k]
		es[i] = spate.Entry{Key: k, Revision: it.rev}
		if it.value != nil {
			n := len(arena)
			arena = append(arena, it.value...)
			es[i].Value = arena[n:len(arena):len(arena)]
		}
	}
	return es
}

// expireLocked removes every ephemeral key whose deadline has passed.
func (b *backend) expireLocked(ks spate.Keyspace, now time.Time) {
	if ks != spate.Ephemeral {
		return
	}
	sp := b.space(ks)
	for sp.deadlines.Len() > 0 {
		d := sp.deadlines[0]
		if d.at.After(now) {
			return
		}
		heap.Pop(&sp.deadlines)
		if d.sess != nil {
			if d.sess.live() && d.sess.deadline.Equal(d.at) {
				d.sess.expired = true
				b.dropLocked(d.sess)
			}
			continue
		}
		if it, ok := sp.items[d.key]; ok && it.rev == d.rev && it.sess == nil {
			b.removeLocked(ks, d.key)
		}
	}
}

// dropLocked deletes the keys still bound to s, in key order.
func (b *backend) dropLocked(s *session) {
	items := b.space(spate.Ephemeral).items
	for _, k := range slices.Sorted(maps.Keys(s.keys)) {
		if it, ok := items[k]; ok && it.sess == s {
			b.removeLocked(spate.Ephemeral, k)
		}
	}
	s.keys = nil
}

func (s *session) live() bool { return !s.expired && !s.ended }

// nextDeadlineLocked returns the earliest pending deadline, dropping
// entries of keys rewritten or deleted since.
func (b *backend) nextDeadlineLocked() (time.Time, bool) {
	sp := b.space(spate.Ephemeral)
	for sp.deadlines.Len() > 0 {
		d := sp.deadlines[0]
		if d.sess != nil {
			if d.sess.live() && d.sess.deadline.Equal(d.at) {
				return d.at, true
			}
		} else if it, ok := sp.items[d.key]; ok && it.rev == d.rev && it.sess == nil {
			return d.at, true
		}
		heap.Pop(&sp.deadlines)
	}
	return time.Time{}, false
}

// armLocked makes sure a timer will expire the earliest pending deadline,
// so watchers see expiry without any other operation touching the store.
// It uses a timer rather than a standing goroutine, so a store left open
// holds no goroutine (which also keeps testing/synctest bubbles clean).
func (b *backend) armLocked() {
	if b.armed || b.handles == 0 {
		return
	}
	at, ok := b.nextDeadlineLocked()
	if !ok {
		return
	}
	wait := max(at.Sub(b.now()), 0)
	if b.opts.Now != nil && wait > b.opts.SweepInterval {
		wait = b.opts.SweepInterval
	}
	b.armed = true
	if b.timer == nil {
		b.timer = time.AfterFunc(wait, b.sweep)
		return
	}
	b.timer.Reset(wait)
}

func (b *backend) sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	b.expireLocked(spate.Ephemeral, b.now())
	b.armLocked()
}

func (b *backend) subscribe(w *watcher) []spate.Entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(w.ks, b.now())
	if w.keys == nil {
		if b.watchers == nil {
			b.watchers = map[*watcher]struct{}{}
		}
		b.watchers[w] = struct{}{}
		return b.snapshotLocked(w.ks, w.prefix)
	}
	idx := &b.byKey[w.ks-1]
	if *idx == nil {
		*idx = map[string]map[*watcher]struct{}{}
	}
	items := b.space(w.ks).items
	var es []spate.Entry
	for _, k := range w.keys {
		set := (*idx)[k]
		if set == nil {
			set = map[*watcher]struct{}{}
			(*idx)[k] = set
		}
		set[w] = struct{}{}
		if it, ok := items[k]; ok {
			es = append(es, spate.Entry{Key: k, Value: slices.Clone(it.value), Revision: it.rev})
		}
	}
	return es
}

func (b *backend) unsubscribe(w *watcher) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.keys == nil {
		delete(b.watchers, w)
		return
	}
	idx := b.byKey[w.ks-1]
	for _, k := range w.keys {
		if set := idx[k]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(idx, k)
			}
		}
	}
}

func (b *backend) broadcastLocked(ks spate.Keyspace, ev spate.WatchEvent) {
	for w := range b.watchers {
		if w.ks == ks && strings.HasPrefix(ev.Key, w.prefix) {
			w.push(ev)
		}
	}
	for w := range b.byKey[ks-1][ev.Key] {
		w.push(ev)
	}
}

// watcher forwards a snapshot and then its queue of live events.
type watcher struct {
	ks     spate.Keyspace
	prefix string   // a key watcher's first key, for errors
	keys   []string // a key watcher's keys (sorted, unique); nil for a prefix watcher
	limit  int

	mu     sync.Mutex
	queue  []spate.WatchEvent
	lagged bool
	signal chan struct{}

	stopOnce sync.Once
	done     chan struct{}
	out      chan spate.WatchEvent
}

// push queues a live event; called under the backend lock, never blocks.
func (w *watcher) push(ev spate.WatchEvent) {
	w.mu.Lock()
	if !w.lagged {
		if len(w.queue) >= w.limit {
			w.lagged = true
			w.queue = nil
		} else {
			w.queue = append(w.queue, ev)
		}
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// op names the watch in errors.
func (w *watcher) op() string {
	if w.keys != nil {
		return "watch-keys"
	}
	return "watch"
}

func (w *watcher) stop() { w.stopOnce.Do(func() { close(w.done) }) }

func (w *watcher) run(ctx context.Context, snapshot []spate.Entry) {
	send := func(ev spate.WatchEvent) bool {
		select {
		case w.out <- ev:
			return true
		case <-ctx.Done():
		case <-w.done:
		}
		return false
	}
	for _, e := range snapshot {
		if !send(spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}) {
			return
		}
	}
	if !send(spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
		return
	}
	for {
		w.mu.Lock()
		batch, lagged := w.queue, w.lagged
		w.queue = nil
		w.mu.Unlock()
		if lagged {
			send(spate.WatchEvent{Kind: spate.WatchError, Err: driver.OpError("mem", w.op(), w.ks, w.prefix, fmt.Errorf(
				"the watcher fell more than %d events behind: %w", w.limit, spate.ErrRetryable))})
			return
		}
		for _, ev := range batch {
			if !send(ev) {
				return
			}
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
			return
		case <-w.done:
			return
		}
	}
}

// deadline is a key's (sess nil) or a session's.
type deadline struct {
	at   time.Time
	key  string
	rev  uint64
	sess *session
}

type deadlineHeap []deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// errExpired is a call's error on a session whose deadline passed.
var errExpired = fmt.Errorf("the session's deadline passed and its keys are gone: %w: %w", spate.ErrSessionExpired, spate.ErrFatal)

// startSession starts a session with a deadline one TTL from now.
func (b *backend) startSession() *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &session{keys: map[string]struct{}{}}
	b.renewLocked(s, b.now())
	return s
}

// renewLocked moves s's deadline to one TTL after now.
func (b *backend) renewLocked(s *session, now time.Time) {
	s.deadline = now.Add(b.opts.TTL)
	sp := b.space(spate.Ephemeral)
	heap.Push(&sp.deadlines, deadline{at: s.deadline, sess: s})
	b.armLocked()
}

// sessionPut is a session's Create (create) or Update.
func (b *backend) sessionPut(s *session, key string, value []byte, expected uint64, create bool) (spate.Outcome, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(spate.Ephemeral, b.now())
	if s.expired {
		return spate.Outcome{}, errExpired
	}
	return b.putLocked(spate.Ephemeral, key, value, expected, create, s), nil
}

// keepAlive renews s, or reports it expired. It writes nothing.
func (b *backend) keepAlive(s *session) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.expireLocked(spate.Ephemeral, now)
	if s.expired {
		return errExpired
	}
	b.renewLocked(s, now)
	return nil
}

// endSession closes s: its keys are deleted (unless it expired, which
// deleted them).
func (b *backend) endSession(s *session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(spate.Ephemeral, b.now())
	if s.live() {
		b.dropLocked(s)
	}
	s.ended = true
}

// NewSession implements [spate.Sessioner] (the driver's half; the
// [driver.PortableStore] wraps it).
func (h *handle) NewSession(ctx context.Context) (spate.Session, error) {
	if err := driver.ContextError(ctx, "mem", "new session"); err != nil {
		return nil, err
	}
	return &memSession{h: h, s: h.b.startSession()}, nil
}

// memSession is the driver's session.
type memSession struct {
	h *handle
	s *session
}

// Create implements [spate.Session]; [Options.Faults] sees it as an
// ephemeral Create of key.
func (m *memSession) Create(ctx context.Context, key string, value []byte) (spate.Outcome, error) {
	var o spate.Outcome
	err := m.h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Create, Keyspace: spate.Ephemeral, Key: key, Value: value}, func() (err error) {
		o, err = m.h.b.sessionPut(m.s, key, value, 0, true)
		return err
	})
	return o, err
}

// Update implements [spate.Session]; [Options.Faults] sees it as an
// ephemeral Update of key.
func (m *memSession) Update(ctx context.Context, key string, value []byte, expected uint64) (spate.Outcome, error) {
	var o spate.Outcome
	err := m.h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.Update, Keyspace: spate.Ephemeral, Key: key, Value: value}, func() (err error) {
		o, err = m.h.b.sessionPut(m.s, key, value, expected, false)
		return err
	})
	return o, err
}

// KeepAlive implements [spate.Session]; [Options.Faults] sees it as a
// [faultstore.KeepAlive].
func (m *memSession) KeepAlive(ctx context.Context) error {
	return m.h.b.opts.Faults.Apply(ctx, faultstore.Call{Op: faultstore.KeepAlive, Keyspace: spate.Ephemeral}, func() error {
		return m.h.b.keepAlive(m.s)
	})
}

// Close implements [spate.Session].
func (m *memSession) Close() error {
	m.h.b.endSession(m.s)
	return nil
}
