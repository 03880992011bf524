package spate

import (
	"context"
	"fmt"
	"time"
)

// meteredStore bounds every store operation by opTimeout, except List,
// whose duration grows with the number of keys (on some backends it is N+1
// round trips): it gets listTimeout, max(3×OpTimeout, a third of the lease).
// An unbounded listing once held an actor for forty seconds on a reconnecting
// client while every commit timed out behind it. A deadline that expires
// surfaces as Retryable; a write that timed out may have landed.
//
// It passes the [Releaser] capability on, bounded and observed like the
// writes, when the store it wraps has it, and reports it only then; so
// too [KeyWatcher] and [Sessioner] (a session's Create and Update are
// bounded and observed as writes, its KeepAlive as a "keep-alive" op,
// its Close is not bounded: the driver bounds its own cleanup).
type meteredStore struct {
	Store
	rel         Releaser   // nil: the store has no Releaser capability
	kw          KeyWatcher // nil: the store has no KeyWatcher capability
	sr          Sessioner  // nil: the store has no Sessioner capability
	timeout     time.Duration
	listTimeout time.Duration
	m           *coordMetrics
}

func newMeteredStore(st Store, timeout, listTimeout time.Duration, m *coordMetrics) *meteredStore {
	s := &meteredStore{Store: st, timeout: timeout, listTimeout: listTimeout, m: m}
	s.rel, _ = ReleaserOf(st)
	s.kw, _ = KeyWatcherOf(st)
	s.sr, _ = SessionerOf(st)
	return s
}

// Capabilities reports the wrapped store's, with UpdateAndDelete and
// WatchKeys only if this wrapper passes them on.
func (s *meteredStore) Capabilities() Capabilities {
	c := s.Store.Capabilities()
	c.UpdateAndDelete = s.rel != nil
	c.WatchKeys = s.kw != nil
	c.Sessions = s.sr != nil
	return c
}

// NewSession implements [Sessioner] over the wrapped store's, bounded like
// a write; the session's calls are bounded too.
func (s *meteredStore) NewSession(ctx context.Context) (Session, error) {
	if s.sr == nil {
		return nil, fmt.Errorf("store new-session: the store has no Sessioner capability: %w", ErrFatal)
	}
	defer s.observe("put", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	in, err := s.sr.NewSession(ctx)
	if err != nil {
		return nil, timedOut(ctx, "new-session", err)
	}
	return &meteredSession{Session: in, s: s}, nil
}

// meteredSession bounds and observes a session's calls as meteredStore
// does the store's.
type meteredSession struct {
	Session
	s *meteredStore
}

func (m *meteredSession) Create(ctx context.Context, key string, v []byte) (Outcome, error) {
	defer m.s.observe("put", time.Now())
	ctx, cancel := m.s.bounded(ctx)
	defer cancel()
	o, err := m.Session.Create(ctx, key, v)
	return o, timedOut(ctx, "session-create", err)
}

func (m *meteredSession) Update(ctx context.Context, key string, v []byte, exp uint64) (Outcome, error) {
	defer m.s.observe("put", time.Now())
	ctx, cancel := m.s.bounded(ctx)
	defer cancel()
	o, err := m.Session.Update(ctx, key, v, exp)
	return o, timedOut(ctx, "session-update", err)
}

func (m *meteredSession) KeepAlive(ctx context.Context) error {
	defer m.s.observe("keep-alive", time.Now())
	ctx, cancel := m.s.bounded(ctx)
	defer cancel()
	return timedOut(ctx, "keep-alive", m.Session.KeepAlive(ctx))
}

// UpdateAndDelete implements [Releaser] over the wrapped store's.
func (s *meteredStore) UpdateAndDelete(ctx context.Context, durableKey string, v []byte, exp uint64,
	ephemeralKey string, leaseExp uint64) (Outcome, Outcome, error) {
	if s.rel == nil {
		return Outcome{}, Outcome{}, fmt.Errorf("store update-and-delete: the store has no Releaser capability: %w", ErrFatal)
	}
	defer s.observe("put", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	u, d, err := s.rel.UpdateAndDelete(ctx, durableKey, v, exp, ephemeralKey, leaseExp)
	return u, d, timedOut(ctx, "update-and-delete", err)
}

func (s *meteredStore) observe(op string, start time.Time) {
	s.m.opObserver(op).Observe(time.Since(start).Seconds())
}

func (s *meteredStore) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// timedOut classifies an expired per-operation deadline as Retryable.
func timedOut(ctx context.Context, op string, err error) error {
	if err != nil && ctx.Err() == context.DeadlineExceeded && kindOf(err) != kindRetryable {
		return fmt.Errorf("store %s: no answer within the op timeout: %w: %w", op, err, ErrRetryable)
	}
	return err
}

func (s *meteredStore) Create(ctx context.Context, ks Keyspace, key string, v []byte) (Outcome, error) {
	defer s.observe("put", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	o, err := s.Store.Create(ctx, ks, key, v)
	return o, timedOut(ctx, "create", err)
}

func (s *meteredStore) Update(ctx context.Context, ks Keyspace, key string, v []byte, exp uint64) (Outcome, error) {
	defer s.observe("put", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	o, err := s.Store.Update(ctx, ks, key, v, exp)
	return o, timedOut(ctx, "update", err)
}

func (s *meteredStore) Get(ctx context.Context, ks Keyspace, key string) (Entry, bool, error) {
	defer s.observe("get", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	e, ok, err := s.Store.Get(ctx, ks, key)
	return e, ok, timedOut(ctx, "get", err)
}

func (s *meteredStore) Delete(ctx context.Context, ks Keyspace, key string, exp uint64) (Outcome, error) {
	defer s.observe("delete", time.Now())
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	o, err := s.Store.Delete(ctx, ks, key, exp)
	return o, timedOut(ctx, "delete", err)
}

func (s *meteredStore) List(ctx context.Context, ks Keyspace, prefix string) ([]Entry, error) {
	defer s.observe("list", time.Now())
	ctx, cancel := context.WithTimeout(ctx, s.listTimeout)
	defer cancel()
	es, err := s.Store.List(ctx, ks, prefix)
	return es, timedOut(ctx, "list", err)
}

// Watch bounds only the establishment: the stream itself lives as long as
// ctx.
func (s *meteredStore) Watch(ctx context.Context, ks Keyspace, prefix string) (<-chan WatchEvent, error) {
	return s.establish(ctx, ks, "watch", prefix, func(ctx context.Context) (<-chan WatchEvent, error) {
		return s.Store.Watch(ctx, ks, prefix)
	})
}

// WatchKeys implements [KeyWatcher] over the wrapped store's, bounded as
// Watch is.
func (s *meteredStore) WatchKeys(ctx context.Context, ks Keyspace, keys []string) (<-chan WatchEvent, error) {
	if s.kw == nil {
		return nil, fmt.Errorf("store watch-keys: the store has no KeyWatcher capability: %w", ErrFatal)
	}
	label := ""
	if len(keys) > 0 {
		label = keys[0]
	}
	return s.establish(ctx, ks, "watch-keys", label, func(ctx context.Context) (<-chan WatchEvent, error) {
		return s.kw.WatchKeys(ctx, ks, keys)
	})
}

// establish opens a stream with open, bounding only the establishment by
// the op timeout: the stream itself lives as long as ctx.
func (s *meteredStore) establish(ctx context.Context, ks Keyspace, op, key string,
	open func(context.Context) (<-chan WatchEvent, error)) (<-chan WatchEvent, error) {
	defer s.observe("watch", time.Now())
	type result struct {
		ch  <-chan WatchEvent
		err error
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan result, 1)
	go func() {
		ch, err := open(wctx)
		done <- result{ch, err}
	}()
	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			cancel()
			return nil, r.err
		}
		context.AfterFunc(ctx, cancel) // the stream lives exactly as long as ctx
		return r.ch, nil
	case <-timer.C:
		cancel()
		go func() { // reap a late-established stream
			if r := <-done; r.err == nil {
				for range r.ch {
				}
			}
		}()
		return nil, fmt.Errorf("store %s %s %q: not established within the op timeout (%v): %w", op, ks, key, s.timeout, ErrRetryable)
	case <-ctx.Done():
		cancel()
		go func() {
			if r := <-done; r.err == nil {
				for range r.ch {
				}
			}
		}()
		return nil, contextError(ctx, "store", op)
	}
}
