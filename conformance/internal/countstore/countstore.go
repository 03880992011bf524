// Package countstore is the counting store wrapper the conformance
// package's lifecycle measurement (scale.MeasureLifecycle) and
// conformance/scale's fleet measurement share: it counts a worker's store
// traffic (writes, reads, watch events, re-reads after a watch break), can
// break every open watch at once, and can hide the optional capabilities.
package countstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/spate-go/spate"
)

// Counters are the fleet's totals, shared by every worker's [Store]: the
// writes, the live watch events and the entries read.
type Counters struct {
	Writes, Events, Reads atomic.Int64
	mu                    sync.Mutex
	brk                   chan struct{} // closed to break every open watch
}

// NewCounters returns zeroed counters.
func NewCounters() *Counters { return &Counters{brk: make(chan struct{})} }

// BreakAll breaks every watch open through a Store counting into c.
func (c *Counters) BreakAll() {
	c.mu.Lock()
	close(c.brk)
	c.brk = make(chan struct{})
	c.mu.Unlock()
}

func (c *Counters) breaker() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.brk
}

// Store counts a worker's store traffic and can break its watches.
// With Calls set it also reports every keyed call (the lifecycle
// measurement); with Plain set it hides the Releaser capability, with
// WholeJob the KeyWatcher capability. C is required.
type Store struct {
	spate.Store
	C        *Counters
	Reads    atomic.Int64 // this worker's reads
	Rereads  atomic.Int64 // snapshot entries re-read because a break ended their watch
	Watching atomic.Int64 // keys listed by this worker's open key watches
	wmu      sync.Mutex
	broken   [2]map[string]bool // by keyspace: prefixes whose watch a break ended, not yet re-opened
	lostKeys [2]map[string]bool // by keyspace: keys whose key watch a break ended, not yet re-read
	Calls    CallRecorder
	Plain    bool
	WholeJob bool // hide the KeyWatcher capability
}

// CallRecorder takes a Store's keyed calls as they return: op names the
// call, ok is whether it won (or, for a get, found the key).
type CallRecorder interface {
	Add(op string, ks spate.Keyspace, key string, ok bool, err error)
}

// logCall reports a keyed call to Calls, if set.
func (s *Store) logCall(op string, ks spate.Keyspace, key string, ok bool, err error) {
	if s.Calls != nil {
		s.Calls.Add(op, ks, key, ok, err)
	}
}

func (s *Store) Create(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
	s.C.Writes.Add(1)
	o, err := s.Store.Create(ctx, ks, key, v)
	s.logCall("create", ks, key, o.Won, err)
	return o, err
}

func (s *Store) Update(ctx context.Context, ks spate.Keyspace, key string, v []byte, rev uint64) (spate.Outcome, error) {
	s.C.Writes.Add(1)
	o, err := s.Store.Update(ctx, ks, key, v, rev)
	s.logCall("update", ks, key, o.Won, err)
	return o, err
}

// read counts n entries read, for the fleet and for this worker.
func (s *Store) read(n int64) {
	s.C.Reads.Add(n)
	s.Reads.Add(n)
}

// Capabilities passes the Releaser capability on when the store has it
// (and plain is not set), and the KeyWatcher capability when the store
// has it (and wholeJob is not set).
func (s *Store) Capabilities() spate.Capabilities {
	c := s.Store.Capabilities()
	_, c.UpdateAndDelete = spate.ReleaserOf(s.Store)
	c.UpdateAndDelete = c.UpdateAndDelete && !s.Plain
	_, c.WatchKeys = spate.KeyWatcherOf(s.Store)
	c.WatchKeys = c.WatchKeys && !s.WholeJob
	_, c.Sessions = spate.SessionerOf(s.Store)
	return c
}

// NewSession passes the Sessioner capability on when the store has it;
// the session's Create and Update count as writes, and so does its
// KeepAlive (one round trip that renews every bound key).
func (s *Store) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := spate.SessionerOf(s.Store)
	if !ok {
		return nil, fmt.Errorf("conformance: the store has no Sessioner capability: %w", spate.ErrFatal)
	}
	in, err := sr.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return &countingSession{Session: in, s: s}, nil
}

type countingSession struct {
	spate.Session
	s *Store
}

func (cs *countingSession) Create(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
	cs.s.C.Writes.Add(1)
	o, err := cs.Session.Create(ctx, key, v)
	cs.s.logCall("session-create", spate.Ephemeral, key, o.Won, err)
	return o, err
}

func (cs *countingSession) Update(ctx context.Context, key string, v []byte, rev uint64) (spate.Outcome, error) {
	cs.s.C.Writes.Add(1)
	o, err := cs.Session.Update(ctx, key, v, rev)
	cs.s.logCall("session-update", spate.Ephemeral, key, o.Won, err)
	return o, err
}

func (cs *countingSession) KeepAlive(ctx context.Context) error {
	cs.s.C.Writes.Add(1)
	err := cs.Session.KeepAlive(ctx)
	cs.s.logCall("keep-alive", spate.Ephemeral, "", err == nil, err)
	return err
}

// UpdateAndDelete counts one write: the release's one round trip.
func (s *Store) UpdateAndDelete(ctx context.Context, dk string, v []byte, rev uint64, ek string, leaseRev uint64) (spate.Outcome, spate.Outcome, error) {
	r, ok := spate.ReleaserOf(s.Store)
	if !ok || s.Plain {
		return spate.Outcome{}, spate.Outcome{}, fmt.Errorf("conformance: the store has no Releaser capability: %w", spate.ErrFatal)
	}
	s.C.Writes.Add(1)
	u, d, err := r.UpdateAndDelete(ctx, dk, v, rev, ek, leaseRev)
	s.logCall("update-and-delete", spate.Durable, dk, u.Won && d.Won, err)
	return u, d, err
}

func (s *Store) Delete(ctx context.Context, ks spate.Keyspace, key string, rev uint64) (spate.Outcome, error) {
	s.C.Writes.Add(1)
	o, err := s.Store.Delete(ctx, ks, key, rev)
	s.logCall("delete", ks, key, o.Won, err)
	return o, err
}

func (s *Store) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	s.read(1)
	e, ok, err := s.Store.Get(ctx, ks, key)
	s.logCall("get", ks, key, ok, err)
	return e, ok, err
}

func (s *Store) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	es, err := s.Store.List(ctx, ks, prefix)
	s.read(int64(max(len(es), 1)))
	return es, err
}

func (s *Store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return s.count(ctx, ks, prefix, nil, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return s.Store.Watch(ctx, ks, prefix)
	})
}

// WatchKeys counts a key watch's traffic as Watch does.
func (s *Store) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(s.Store)
	if !ok || s.WholeJob {
		return nil, fmt.Errorf("conformance: the store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	return s.count(ctx, ks, "", keys, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return kw.WatchKeys(ctx, ks, keys)
	})
}

// opened records a watch of prefix in ks, or of keys (non-nil) in ks,
// and says whether it re-opens a prefix watch that a break ended.
func (s *Store) opened(ks spate.Keyspace, prefix string, keys []string) (reopen bool) {
	s.Watching.Add(int64(len(keys)))
	if keys != nil {
		return false
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	reopen = s.broken[ks-1][prefix]
	delete(s.broken[ks-1], prefix)
	return reopen
}

// closed records the end of a watch opened as opened was told; broke says
// a break ended it: a prefix watch is then re-read when re-opened, a key
// watch's keys each when a later snapshot first holds it.
func (s *Store) closed(ks spate.Keyspace, prefix string, keys []string, broke bool) {
	s.Watching.Add(-int64(len(keys)))
	if !broke {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.broken[ks-1] == nil {
		s.broken[ks-1], s.lostKeys[ks-1] = map[string]bool{}, map[string]bool{}
	}
	if keys == nil {
		s.broken[ks-1][prefix] = true
	}
	for _, k := range keys {
		s.lostKeys[ks-1][k] = true
	}
}

// reread says whether a snapshot entry of key in ks re-reads a key whose
// key watch a break ended (the first snapshot to hold it since).
func (s *Store) reread(ks spate.Keyspace, key string) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if !s.lostKeys[ks-1][key] {
		return false
	}
	delete(s.lostKeys[ks-1], key)
	return true
}

// count opens a stream with open and counts what it delivers: snapshot
// entries as reads, live puts and deletes as events. The stream watches
// prefix in ks, or keys (non-nil) in ks. A snapshot entry
// that re-reads what a break took away (a re-opened prefix watch's, or a
// key whose key watch broke) counts as a re-read too, whatever group the
// key is watched in now.
func (s *Store) count(ctx context.Context, ks spate.Keyspace, prefix string, keys []string, open func(context.Context) (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	wctx, cancel := context.WithCancel(ctx)
	in, err := open(wctx)
	if err != nil {
		cancel()
		return nil, err
	}
	brk := s.C.breaker()
	reopen := s.opened(ks, prefix, keys)
	out := make(chan spate.WatchEvent)
	go func() {
		broke := false
		defer func() { s.closed(ks, prefix, keys, broke) }()
		defer close(out)
		defer cancel()
		snap := true
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				switch {
				case ev.Kind == spate.WatchSnapshotDone:
					snap = false
				case snap && ev.Kind == spate.WatchPut:
					s.read(1)
					if reopen || keys != nil && s.reread(ks, ev.Key) {
						s.Rereads.Add(1)
					}
				case !snap && (ev.Kind == spate.WatchPut || ev.Kind == spate.WatchDelete):
					s.C.Events.Add(1)
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-brk:
				broke = true
				select {
				case out <- spate.WatchEvent{Kind: spate.WatchError, Err: spate.Retryablef("scale: simulated store restart")}:
				case <-ctx.Done():
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
