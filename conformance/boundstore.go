package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/spate-go/spate"
)

// A rule reaches the driver only through a boundStore: every call of the
// store, of its optional capabilities and of its sessions goes through
// bounded, so a driver whose Get (or any other call) never returns, sleeps
// or spins ends the rule with a verdict naming the call, as its Watch does.
// [env.open] hands every rule its stores wrapped, and the store of every
// coordinator a rule starts (a fleet's workers, the starvation scenarios'
// solo workers) is wrapped too: a call a coordinator makes on its own
// goroutines that never returns fails the rule naming the call, instead
// of hanging the coordinator (and the rule's cleanup, which closes it).
//
// The wrapper has exactly the driver's capabilities: a rule that finds
// [spate.Releaser], [spate.KeyWatcher] or [spate.Sessioner] by a type
// assertion finds it on the wrapper when, and only when, the driver
// implements it (bind picks, among the eight combinations, the struct that
// embeds the matching bound methods), so the rules that check how a store
// reports its capabilities judge the driver, not the wrapper.

// boundStore is a store whose every call goes through bounded.
type boundStore struct {
	e     *env
	s     spate.Store
	limit time.Duration // callBoundFor the store's TTL
}

// unbound is implemented by every wrapper bind returns.
type unbound interface{ driver() spate.Store }

func (b *boundStore) driver() spate.Store { return b.s }

// driverOf returns the driver's own store behind s (s itself when s is not
// a wrapper of bind): a message that names the store's type names it.
func driverOf(s spate.Store) spate.Store {
	if u, ok := s.(unbound); ok {
		return u.driver()
	}
	return s
}

// bind wraps s so that every call goes through bounded. The bound of each
// call derives from the store's TTL (callBoundFor); reading it is itself a
// bounded call.
func bind(e *env, s spate.Store) spate.Store {
	if _, ok := s.(unbound); ok {
		return s
	}
	b := &boundStore{e: e, s: s, limit: callBound}
	if c, err := bounded(e, callBound, "Capabilities()", func() (spate.Capabilities, error) { return s.Capabilities(), nil }); err == nil {
		b.limit = callBoundFor(c.TTL)
	}
	r, isR := s.(spate.Releaser)
	k, isK := s.(spate.KeyWatcher)
	n, isN := s.(spate.Sessioner)
	br, bk, bn := &boundReleaser{b, r}, &boundKeyWatcher{b, k}, &boundSessioner{b, n}
	switch {
	case isR && isK && isN:
		return struct {
			*boundStore
			*boundReleaser
			*boundKeyWatcher
			*boundSessioner
		}{b, br, bk, bn}
	case isR && isK:
		return struct {
			*boundStore
			*boundReleaser
			*boundKeyWatcher
		}{b, br, bk}
	case isR && isN:
		return struct {
			*boundStore
			*boundReleaser
			*boundSessioner
		}{b, br, bn}
	case isK && isN:
		return struct {
			*boundStore
			*boundKeyWatcher
			*boundSessioner
		}{b, bk, bn}
	case isR:
		return struct {
			*boundStore
			*boundReleaser
		}{b, br}
	case isK:
		return struct {
			*boundStore
			*boundKeyWatcher
		}{b, bk}
	case isN:
		return struct {
			*boundStore
			*boundSessioner
		}{b, bn}
	default:
		return b
	}
}

// call runs one call of the driver, named what, through bounded.
func call[T any](b *boundStore, what string, f func() (T, error)) (T, error) {
	return bounded(b.e, b.limit, what, f)
}

// two is what UpdateAndDelete returns.
type two struct{ a, b spate.Outcome }

// got is what Get returns.
type got struct {
	en spate.Entry
	ok bool
}

func (b *boundStore) Capabilities() spate.Capabilities {
	c, _ := call(b, "Capabilities()", func() (spate.Capabilities, error) { return b.s.Capabilities(), nil })
	return c
}

func (b *boundStore) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	return call(b, fmt.Sprintf("Create(%s, %q)", ks, key), func() (spate.Outcome, error) {
		return b.s.Create(ctx, ks, key, value)
	})
}

func (b *boundStore) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	return call(b, fmt.Sprintf("Update(%s, %q, at %d)", ks, key, expected), func() (spate.Outcome, error) {
		return b.s.Update(ctx, ks, key, value, expected)
	})
}

func (b *boundStore) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	g, err := call(b, fmt.Sprintf("Get(%s, %q)", ks, key), func() (got, error) {
		en, ok, err := b.s.Get(ctx, ks, key)
		return got{en, ok}, err
	})
	return g.en, g.ok, err
}

func (b *boundStore) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	return call(b, fmt.Sprintf("Delete(%s, %q, at %d)", ks, key, expected), func() (spate.Outcome, error) {
		return b.s.Delete(ctx, ks, key, expected)
	})
}

func (b *boundStore) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return call(b, fmt.Sprintf("Watch(%s, %q)", ks, prefix), func() (<-chan spate.WatchEvent, error) {
		return b.s.Watch(ctx, ks, prefix)
	})
}

func (b *boundStore) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	return call(b, fmt.Sprintf("List(%s, %q)", ks, prefix), func() ([]spate.Entry, error) {
		return b.s.List(ctx, ks, prefix)
	})
}

func (b *boundStore) Close() error {
	_, err := call(b, "Close()", func() (struct{}, error) { return struct{}{}, b.s.Close() })
	return err
}

type boundReleaser struct {
	b *boundStore
	r spate.Releaser
}

func (r *boundReleaser) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	o, err := call(r.b, fmt.Sprintf("UpdateAndDelete(%q at %d, %q at %d)", durableKey, expected, ephemeralKey, leaseExpected), func() (two, error) {
		u, d, err := r.r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
		return two{u, d}, err
	})
	return o.a, o.b, err
}

type boundKeyWatcher struct {
	b *boundStore
	k spate.KeyWatcher
}

func (k *boundKeyWatcher) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	return call(k.b, watchKeysName(ks, keys), func() (<-chan spate.WatchEvent, error) {
		return k.k.WatchKeys(ctx, ks, keys)
	})
}

type boundSessioner struct {
	b *boundStore
	n spate.Sessioner
}

func (n *boundSessioner) NewSession(ctx context.Context) (spate.Session, error) {
	s, err := call(n.b, "NewSession()", func() (spate.Session, error) { return n.n.NewSession(ctx) })
	if err != nil || s == nil {
		return s, err
	}
	return &boundSession{b: n.b, s: s}, nil
}

// boundSession is a session whose every call goes through bounded.
type boundSession struct {
	b *boundStore
	s spate.Session
}

func (s *boundSession) Create(ctx context.Context, key string, value []byte) (spate.Outcome, error) {
	return call(s.b, fmt.Sprintf("Session.Create(%q)", key), func() (spate.Outcome, error) { return s.s.Create(ctx, key, value) })
}

func (s *boundSession) Update(ctx context.Context, key string, value []byte, expected uint64) (spate.Outcome, error) {
	return call(s.b, fmt.Sprintf("Session.Update(%q, at %d)", key, expected), func() (spate.Outcome, error) {
		return s.s.Update(ctx, key, value, expected)
	})
}

func (s *boundSession) KeepAlive(ctx context.Context) error {
	_, err := call(s.b, "Session.KeepAlive()", func() (struct{}, error) { return struct{}{}, s.s.KeepAlive(ctx) })
	return err
}

func (s *boundSession) Close() error {
	_, err := call(s.b, "Session.Close()", func() (struct{}, error) { return struct{}{}, s.s.Close() })
	return err
}
