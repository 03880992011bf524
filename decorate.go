package spate

import (
	"context"
	"fmt"
	"log/slog"
)

// Decorate returns wrapper with the optional capabilities of inner
// ([Releaser], [KeyWatcher], [Sessioner]) passed through: wrapper's own
// method when it has one, inner's otherwise.
//
// A store decorator (to count calls, trace them, inject faults) is most
// easily written as a struct that embeds [Store] and overrides some of its
// methods. Such a struct keeps inner's Capabilities (which say
// WatchKeys, Sessions, UpdateAndDelete) but not inner's optional methods,
// which embedding an interface does not promote; the coordinator then
// uses none of them, and silently pays for it: every worker watches the
// whole job (a write reaches every worker, not just the leader and its
// owner), leases are rewritten one by one, a hand-back takes two calls.
// Decorate keeps them:
//
//	type counting struct{ spate.Store; n *atomic.Int64 }
//	func (c counting) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) { ... }
//
//	st = spate.Decorate(inner, counting{Store: inner, n: &n})
//
// The result reports a capability only when inner has it.
// [NewStoreCoordinator] warns about a store that reports a capability it
// lacks the method of, naming it.
func Decorate(inner, wrapper Store) Store {
	d := decorated{Store: wrapper}
	if r, ok := ReleaserOf(inner); ok {
		d.r = pick(wrapper, r)
	}
	if w, ok := KeyWatcherOf(inner); ok {
		d.w = pick(wrapper, w)
	}
	if s, ok := SessionerOf(inner); ok {
		d.s = pick(wrapper, s)
	}
	return d
}

// pick is wrapper's own implementation of the capability T if it has one,
// else inner's.
func pick[T any](wrapper Store, inner T) T {
	if own, ok := wrapper.(T); ok {
		return own
	}
	return inner
}

// decorated implements every optional interface and reports only those it
// has a method for.
type decorated struct {
	Store
	r Releaser
	w KeyWatcher
	s Sessioner
}

func (d decorated) Capabilities() Capabilities {
	c := d.Store.Capabilities()
	c.UpdateAndDelete = c.UpdateAndDelete && d.r != nil
	c.WatchKeys = c.WatchKeys && d.w != nil
	c.Sessions = c.Sessions && d.s != nil
	return c
}

func (d decorated) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (Outcome, Outcome, error) {
	if d.r == nil {
		return Outcome{}, Outcome{}, Fatalf("store: UpdateAndDelete: the store has no Releaser capability")
	}
	return d.r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
}

func (d decorated) WatchKeys(ctx context.Context, ks Keyspace, keys []string) (<-chan WatchEvent, error) {
	if d.w == nil {
		return nil, Fatalf("store: WatchKeys: the store has no KeyWatcher capability")
	}
	return d.w.WatchKeys(ctx, ks, keys)
}

func (d decorated) NewSession(ctx context.Context) (Session, error) {
	if d.s == nil {
		return nil, Fatalf("store: NewSession: the store has no Sessioner capability")
	}
	return d.s.NewSession(ctx)
}

// warnLostCapabilities logs, once at construction, each capability st
// reports without implementing its method: the mark of a wrapper that
// embeds Store and so hides the inner store's optional methods.
func warnLostCapabilities(log *slog.Logger, st Store) {
	caps := st.Capabilities()
	lost := func(name, method, cost string) {
		log.Warn(fmt.Sprintf("the store reports the %s capability but %T has no %s method (a wrapper that embeds spate.Store hides it): the coordinator goes without it, %s; wrap with spate.Decorate(inner, wrapper) to keep it",
			name, st, method, cost), "capability", name)
	}
	if _, ok := st.(KeyWatcher); caps.WatchKeys && !ok {
		lost("WatchKeys", "WatchKeys", "so every worker watches the whole job and every write reaches every worker")
	}
	if _, ok := st.(Sessioner); caps.Sessions && !ok {
		lost("Sessions", "NewSession", "so every split lease is rewritten one by one at every beat")
	}
	if _, ok := st.(Releaser); caps.UpdateAndDelete && !ok {
		lost("UpdateAndDelete", "UpdateAndDelete", "so a hand-back takes two calls instead of one")
	}
}
