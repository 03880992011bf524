package conformance

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spate-go/spate"
)

// The rules of the optional [spate.Sessioner] capability: ephemeral keys
// that share one lifetime, renewed by a KeepAlive that writes no key. A
// store without it skips them, with skipNoSessioner as the reason.

// sessionRules are the store rules of the Sessioner capability; StoreRules
// ends with them.
var sessionRules = []Rule{
	{Name: "SessionerIsReported",
		Contract: "Sessions reports whether the store has the optional [Sessioner] capability, under the same rules as UpdateAndDelete.",
		body:     testSessionerReported},
	{Name: "SessionKeysLiveWhileKeptAlive",
		Contract: "A key bound to a session lives as long as the session: until one TTL after the start of the session's last successful KeepAlive (or of NewSession), however recently the key was written; it then expires, and its expiry reaches watchers as a delete, as any ephemeral key's does.",
		body:     testSessionKeysLive},
	{Name: "KeepAliveWritesNothing",
		Contract: "It writes no key: no watcher receives an event and no revision moves.",
		body:     testKeepAliveWritesNothing},
	{Name: "SessionCreateAndUpdateAreFenced",
		Contract: "Create is [Store.Create] in the [Ephemeral] keyspace, the key bound to the session.",
		body:     testSessionFenced},
	{Name: "StoreUpdateUnbinds",
		Contract: "Store.Update of a bound key (not Session.Update) unbinds it: it then expires one TTL after that write.",
		body:     testStoreUpdateUnbinds},
	{Name: "ExpiredSessionFails",
		Contract: "On a session that expired it returns an error matching [ErrSessionExpired] and [ErrFatal].",
		body:     testExpiredSessionFails},
	{Name: "SessionCloseDeletesItsKeys",
		Contract: "Close ends the session: the keys bound to it are deleted, and watchers receive the deletes.",
		body:     testSessionCloseDeletes},
	{Name: "SessionArgumentsAndStoreClose",
		Contract: "Its calls check their arguments and classify their errors as Store.Create and Store.Update do; the store's Close closes every open session, and after it every session call but Close fails with an error matching [ErrClosed] and [ErrFatal].",
		body:     testSessionArguments},
}

// skipNoSessioner is the reason the Sessioner rules give when they skip.
const skipNoSessioner = "the store does not have the optional spate.Sessioner capability (Capabilities.Sessions is false, or the store does not implement the method): its rules do not apply, and the coordinator rewrites each lease to renew it"

// sessioner returns s's Sessioner, or skips the rule.
func sessioner(e *env, s spate.Store) spate.Sessioner {
	e.t.Helper()
	sr, ok := spate.SessionerOf(s)
	if !ok {
		e.t.Skip(skipNoSessioner)
	}
	return sr
}

// newSession starts a session of s, closed at cleanup.
func newSession(e *env, s spate.Store) spate.Session {
	e.t.Helper()
	sess, err := sessioner(e, s).NewSession(e.ctx)
	if err != nil {
		e.t.Fatalf("new session: unexpected error: %v", err)
	}
	e.t.Cleanup(func() { _ = sess.Close() })
	return sess
}

func mustSessionCreate(e *env, sess spate.Session, key, value string) uint64 {
	e.t.Helper()
	o, err := sess.Create(e.ctx, key, []byte(value))
	if err != nil {
		e.t.Fatalf("session create %q: unexpected error: %v", key, err)
	}
	if !o.Won || o.Revision == 0 {
		e.t.Fatalf("rule: a session's Create is Store.Create: create of an absent key wins at a revision; create %q won %t at %d", key, o.Won, o.Revision)
	}
	return o.Revision
}

func mustSessionUpdate(e *env, sess spate.Session, key, value string, rev uint64) spate.Outcome {
	e.t.Helper()
	o, err := sess.Update(e.ctx, key, []byte(value), rev)
	if err != nil {
		e.t.Fatalf("session update %q: unexpected error: %v", key, err)
	}
	return o
}

func mustKeepAlive(e *env, sess spate.Session, what string) {
	e.t.Helper()
	if err := sess.KeepAlive(e.ctx); err != nil {
		e.t.Fatalf("rule: KeepAlive renews a live session; %s failed: %v", what, err)
	}
}

// keepAliveFor calls KeepAlive every TTL/3 for d and returns when the last
// one started and how many it made.
func keepAliveFor(e *env, sess spate.Session, ttl, d time.Duration) (time.Time, int) {
	e.t.Helper()
	start := time.Now()
	last, n := start, 0
	for time.Since(start) < d {
		time.Sleep(ttl / 3)
		last = time.Now()
		mustKeepAlive(e, sess, "a KeepAlive every TTL/3")
		n++
	}
	return last, n
}

// expectDeletes receives until a delete of every key arrives, by deadline,
// failing on a put of one of them.
func expectDeletes(e *env, ch <-chan spate.WatchEvent, deadline time.Time, rule string, keys ...string) {
	e.t.Helper()
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	for len(want) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			e.t.Fatalf("rule: %s; no delete of %v within the bound (%v)", rule, slices.Sorted(maps.Keys(want)), deadline.Format(time.StampMilli))
		}
		var ev spate.WatchEvent
		timer := time.NewTimer(left)
		select {
		case got, ok := <-ch:
			timer.Stop()
			if !ok {
				e.t.Fatalf("watch closed while waiting for the deletes of %v", keys)
			}
			ev = got
		case <-timer.C:
			continue
		}
		switch {
		case ev.Kind == spate.WatchError:
			e.t.Fatalf("watch broke while waiting for the deletes of %v: %v", keys, ev.Err)
		case !want[ev.Key]:
		case ev.Kind == spate.WatchDelete:
			delete(want, ev.Key)
		default:
			e.t.Errorf("rule: %s; %q was %v (@%d) instead of deleted", rule, ev.Key, ev.Kind, ev.Revision)
		}
	}
}

// untilPut receives until the put of key at rev.
func untilPut(e *env, ch <-chan spate.WatchEvent, key string, rev uint64) {
	e.t.Helper()
	for {
		ev := expectEvent(e, ch, key, eventWait)
		if ev.Kind == spate.WatchPut && ev.Revision >= rev {
			return
		}
	}
}

func testSessionerReported(e *env) {
	s := e.open()
	reported := s.Capabilities().Sessions
	_, implements := s.(spate.Sessioner)
	switch {
	case reported && !implements:
		e.t.Errorf("rule: a store that reports Capabilities.Sessions implements spate.Sessioner; %T does not (a wrapper that does not pass the method on must clear the flag)", driverOf(s))
	case !reported && implements:
		if _, ok := spate.SessionerOf(s); ok {
			e.t.Errorf("rule: a store that implements Sessioner without reporting it is used as one without; SessionerOf returned it")
		}
		e.t.Skip(skipNoSessioner)
	case !reported:
		e.t.Skip(skipNoSessioner)
	default:
		if _, ok := spate.SessionerOf(s); !ok {
			e.t.Errorf("rule: SessionerOf returns a store that reports and implements Sessioner; it did not")
		}
		sess := newSession(e, s)
		mustSessionCreate(e, sess, "sir.k", "v")
		mustKeepAlive(e, sess, "a KeepAlive of a new session")
	}
}

// testSessionKeysLive: two keys bound to a session, one written once at
// the start, outlive two TTLs of KeepAlive every TTL/3 (read each time),
// are still there most of a TTL after the last KeepAlive, and then expire
// within the expiry bound of it, each reaching a watcher as a delete.
func testSessionKeysLive(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	sess := newSession(e, s)
	ch := mustWatch(e, s, spate.Ephemeral, "sli.")
	readSnapshot(e, ch)
	ra := mustSessionCreate(e, sess, "sli.a", "a")
	rb := mustSessionCreate(e, sess, "sli.b", "b")
	untilPut(e, ch, "sli.a", ra)
	untilPut(e, ch, "sli.b", rb)
	start := time.Now()
	last, n := start, 0
	for time.Since(start) < 2*ttl {
		time.Sleep(ttl / 3)
		last = time.Now()
		mustKeepAlive(e, sess, "a KeepAlive every TTL/3")
		n++
		for _, k := range []string{"sli.a", "sli.b"} {
			if _, ok := mustGet(e, s, spate.Ephemeral, k); !ok {
				e.t.Fatalf("rule: a key bound to a session lives while the session is kept alive; %q was gone %v after the start (TTL %v, %d KeepAlives every TTL/3)",
					k, time.Since(start).Round(time.Millisecond), ttl, n)
			}
		}
	}
	en, ok := mustGet(e, s, spate.Ephemeral, "sli.b")
	if !ok || en.Revision != rb {
		e.t.Fatalf("rule: a bound key lives however long ago it was written; %q reads @%d (present %t) after %v, want @%d", "sli.b", en.Revision, ok, time.Since(start).Round(time.Millisecond), rb)
	}
	time.Sleep(time.Until(last.Add(ttl * 7 / 10)))
	if _, ok := mustGet(e, s, spate.Ephemeral, "sli.a"); !ok {
		e.t.Errorf("rule: a bound key lives until one TTL after the start of the last KeepAlive; %q was gone %v after it (TTL %v)",
			"sli.a", time.Since(last).Round(time.Millisecond), ttl)
	}
	bound := last.Add(expiryBound(s))
	expectDeletes(e, ch, bound, "a bound key's expiry reaches watchers as a delete", "sli.a", "sli.b")
	for _, k := range []string{"sli.a", "sli.b"} {
		expectAbsent(e, s, spate.Ephemeral, k, "a bound key expires once its session is no longer kept alive")
	}
	e.t.Logf("2 bound keys lived %v through %d KeepAlives (TTL %v), then expired %v after the last",
		last.Sub(start).Round(time.Millisecond), n, ttl, time.Since(last).Round(time.Millisecond))
}

// testKeepAliveWritesNothing: across five KeepAlives, a watcher of the
// keyspace receives nothing of a bound key (an unbound write after them
// arrives first), and Get and List show the key's revision unmoved.
func testKeepAliveWritesNothing(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	sess := newSession(e, s)
	rev := mustSessionCreate(e, sess, "kaw.k", "v")
	ch := mustWatch(e, s, spate.Ephemeral, "kaw.")
	if puts := readSnapshot(e, ch); len(puts) != 1 || puts[0].Revision != rev {
		e.t.Fatalf("watch snapshot of one bound key: %v", puts)
	}
	const beats = 5
	for range beats {
		time.Sleep(ttl / 10)
		mustKeepAlive(e, sess, "a KeepAlive")
	}
	mark := mustCreate(e, s, spate.Ephemeral, "kaw.mark", "after")
	for {
		ev := recvTimeout(e.t, ch, eventWait, "the write after the KeepAlives")
		if ev.Kind == spate.WatchError {
			e.t.Fatalf("watch broke: %v", ev.Err)
		}
		if ev.Key == "kaw.mark" && ev.Revision >= mark {
			break
		}
		e.t.Errorf("rule: KeepAlive writes no key: no watcher receives an event; got %v %q@%d after %d KeepAlives", ev.Kind, ev.Key, ev.Revision, beats)
	}
	en, ok := mustGet(e, s, spate.Ephemeral, "kaw.k")
	if !ok || en.Revision != rev {
		e.t.Errorf("rule: KeepAlive writes no key: no revision moves; %q reads @%d (present %t) after %d KeepAlives, want @%d", "kaw.k", en.Revision, ok, beats, rev)
	}
	list, err := s.List(e.ctx, spate.Ephemeral, "kaw.")
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	for _, l := range list {
		if l.Key == "kaw.k" && l.Revision != rev {
			e.t.Errorf("rule: KeepAlive writes no key; List shows %q@%d, want @%d", l.Key, l.Revision, rev)
		}
	}
	e.t.Logf("%d KeepAlives, no event and no revision of the bound key", beats)
}

// testSessionFenced: a session's Create loses on a live key (bound or
// not) and writes nothing; its Update is a compare-and-swap; both bind,
// an unbound key Update'd through the session included: kept alive past
// its own TTL, it lives, and the session's Close deletes it.
func testSessionFenced(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	sess := newSession(e, s)
	free := mustCreate(e, s, spate.Ephemeral, "fen.free", "plain")
	o, err := sess.Create(e.ctx, "fen.free", []byte("mine"))
	if err != nil {
		e.t.Fatalf("session create of a live key: %v", err)
	}
	if o.Won {
		e.t.Errorf("rule: a session's Create is create-if-absent; it won over a live key")
	}
	expectEntry(e, s, spate.Ephemeral, "fen.free", "plain", free, "a lost session Create writes nothing")

	r1 := mustSessionCreate(e, sess, "fen.k", "v1")
	if o, err := sess.Create(e.ctx, "fen.k", []byte("again")); err != nil || o.Won {
		e.t.Errorf("rule: a session's Create of a key it holds loses; won %t, err %v", o.Won, err)
	}
	expectEntry(e, s, spate.Ephemeral, "fen.k", "v1", r1, "a lost session Create writes nothing")
	if o := mustSessionUpdate(e, sess, "fen.k", "stale", r1+1000); o.Won {
		e.t.Errorf("rule: a session's Update is compare-and-swap; it won at a wrong revision")
	}
	if o := mustSessionUpdate(e, sess, "fen.absent", "x", r1); o.Won {
		e.t.Errorf("rule: a session's Update of an absent key loses; it won")
	}
	expectAbsent(e, s, spate.Ephemeral, "fen.absent", "a session's Update never creates")
	o = mustSessionUpdate(e, sess, "fen.k", "v2", r1)
	if !o.Won || o.Revision <= r1 {
		e.t.Fatalf("rule: a session's Update at the current revision wins with a larger revision; won %t at %d (was %d)", o.Won, o.Revision, r1)
	}
	expectEntry(e, s, spate.Ephemeral, "fen.k", "v2", o.Revision, "a won session Update writes the key")
	if o2 := mustSessionUpdate(e, sess, "fen.k", "stale", r1); o2.Won {
		e.t.Errorf("rule: a session's Update at a stale revision loses; it won")
	}

	// The unbound key, Update'd through the session, binds to it.
	bound := mustSessionUpdate(e, sess, "fen.free", "bound", free)
	if !bound.Won {
		e.t.Fatalf("rule: a session's Update of an unbound key at its revision wins; it lost")
	}
	updated := time.Now()
	_, n := keepAliveFor(e, sess, ttl, ttl+ttl/2)
	for _, k := range []string{"fen.k", "fen.free"} {
		if _, ok := mustGet(e, s, spate.Ephemeral, k); !ok {
			e.t.Errorf("rule: a session's Create and Update bind the key: it lives while the session is kept alive; %q was gone %v after the write (TTL %v, %d KeepAlives)",
				k, time.Since(updated).Round(time.Millisecond), ttl, n)
		}
	}
	if err := sess.Close(); err != nil {
		e.t.Fatalf("session close: %v", err)
	}
	expectAbsent(e, s, spate.Ephemeral, "fen.k", "a key created through the session is bound: the session's Close deletes it")
	expectAbsent(e, s, spate.Ephemeral, "fen.free", "an unbound key Update'd through the session is bound: the session's Close deletes it")
	e.t.Logf("create lost on 2 live keys, update lost at 3 wrong revisions; 2 bound keys lived %v of KeepAlive and went with the session's Close", time.Since(updated).Round(time.Millisecond))
}

// testStoreUpdateUnbinds: a bound key rewritten by Store.Update expires a
// TTL after that write though its session is kept alive, and the
// session's Close no longer deletes such a key.
func testStoreUpdateUnbinds(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	sess := newSession(e, s)
	other := newSession(e, s)
	ra := mustSessionCreate(e, sess, "unb.a", "bound")
	rb := mustSessionCreate(e, other, "unb.b", "bound")
	oa := mustUpdate(e, s, spate.Ephemeral, "unb.a", "plain", ra)
	ob := mustUpdate(e, s, spate.Ephemeral, "unb.b", "plain", rb)
	if !oa.Won || !ob.Won {
		e.t.Fatalf("store update of a bound key at its revision: won %t and %t", oa.Won, ob.Won)
	}
	updated := time.Now()
	if err := other.Close(); err != nil {
		e.t.Fatalf("session close: %v", err)
	}
	expectEntry(e, s, spate.Ephemeral, "unb.b", "plain", ob.Revision, "Store.Update unbinds the key: its former session's Close leaves it")
	_, n := keepAliveFor(e, sess, ttl, expiryBound(s))
	if en, ok := mustGet(e, s, spate.Ephemeral, "unb.a"); ok {
		e.t.Errorf("rule: Store.Update of a bound key unbinds it: it expires one TTL after that write; %q still reads %q@%d %v after it, its former session kept alive (%d KeepAlives, TTL %v)",
			"unb.a", en.Value, en.Revision, time.Since(updated).Round(time.Millisecond), n, ttl)
	}
	expectAbsent(e, s, spate.Ephemeral, "unb.b", "an unbound key expires one TTL after its last write")
	e.t.Logf("2 keys unbound by Store.Update: one outlived its session's Close, one expired under %d KeepAlives", n)
}

// testExpiredSessionFails: a session not kept alive expires with its
// keys (watchers get the deletes); then every call on it fails
// ErrSessionExpired and Fatal, and it writes nothing.
func testExpiredSessionFails(e *env) {
	s := e.open()
	ttlOf(e, s)
	sess := newSession(e, s)
	ch := mustWatch(e, s, spate.Ephemeral, "exs.")
	readSnapshot(e, ch)
	started := time.Now()
	r := mustSessionCreate(e, sess, "exs.k", "v")
	untilPut(e, ch, "exs.k", r)
	expectDeletes(e, ch, started.Add(expiryBound(s)), "a session not kept alive expires, and its keys' expiry reaches watchers as deletes", "exs.k")
	time.Sleep(time.Until(started.Add(expiryBound(s))))
	expectAbsent(e, s, spate.Ephemeral, "exs.k", "the keys of an expired session are gone")
	check := func(what string, err error) {
		e.t.Helper()
		if !errors.Is(err, spate.ErrSessionExpired) || !spate.IsFatal(err) {
			e.t.Errorf("rule: every call on a session that expired fails with ErrSessionExpired and ErrFatal; %s returned %v", what, err)
		}
	}
	check("KeepAlive", sess.KeepAlive(e.ctx))
	_, err := sess.Create(e.ctx, "exs.new", []byte("v"))
	check("Create", err)
	_, err = sess.Update(e.ctx, "exs.k", []byte("v"), r)
	check("Update", err)
	expectAbsent(e, s, spate.Ephemeral, "exs.new", "a call on an expired session writes nothing")
	if err := sess.Close(); err != nil {
		e.t.Errorf("rule: Close of an expired session ends it; got %v", err)
	}
	e.t.Logf("the session expired %v after it started (TTL %v); KeepAlive, Create and Update then failed ErrSessionExpired", time.Since(started).Round(time.Millisecond), s.Capabilities().TTL)
}

// testSessionCloseDeletes: Close deletes the bound keys at once (a read
// right after it finds them gone) and watchers get the deletes; unbound
// keys stay; Close is idempotent and every later call is ErrClosed.
func testSessionCloseDeletes(e *env) {
	s, reader := e.open(), e.open()
	sess := newSession(e, s)
	mustSessionCreate(e, sess, "scl.a", "a")
	mustSessionCreate(e, sess, "scl.b", "b")
	rc := mustCreate(e, s, spate.Ephemeral, "scl.c", "plain")
	ch := mustWatch(e, reader, spate.Ephemeral, "scl.")
	if puts := readSnapshot(e, ch); len(puts) != 3 {
		e.t.Fatalf("snapshot of 3 keys: %v", puts)
	}
	if err := sess.Close(); err != nil {
		e.t.Fatalf("session close: %v", err)
	}
	for _, k := range []string{"scl.a", "scl.b"} {
		expectAbsent(e, reader, spate.Ephemeral, k, "Close deletes the keys bound to the session (a read after it returns finds them gone)")
	}
	expectEntry(e, reader, spate.Ephemeral, "scl.c", "plain", rc, "Close deletes only the keys bound to the session")
	expectDeletes(e, ch, time.Now().Add(eventWait), "watchers receive the deletes of Close", "scl.a", "scl.b")
	if err := sess.Close(); err != nil {
		e.t.Errorf("rule: Close is idempotent; a second Close returned %v", err)
	}
	check := func(what string, err error) {
		e.t.Helper()
		if !errors.Is(err, spate.ErrClosed) || !spate.IsFatal(err) {
			e.t.Errorf("rule: after Close every other call fails with ErrClosed and ErrFatal; %s returned %v", what, err)
		}
	}
	check("KeepAlive", sess.KeepAlive(e.ctx))
	_, err := sess.Create(e.ctx, "scl.new", []byte("v"))
	check("Create", err)
	_, err = sess.Update(e.ctx, "scl.c", []byte("v"), rc)
	check("Update", err)
	expectAbsent(e, s, spate.Ephemeral, "scl.new", "a call on a closed session writes nothing")
	expectEntry(e, s, spate.Ephemeral, "scl.c", "plain", rc, "a call on a closed session writes nothing")
	e.t.Logf("Close deleted 2 bound keys (gone at once, 2 deletes to a watcher), kept 1 unbound key")
}

// testSessionArguments: bad keys and values are Fatal and write nothing,
// a dead context is Retryable, revision 0 loses; the store's Close ends
// its sessions (their keys go) and then every session call is ErrClosed.
func testSessionArguments(e *env) {
	s := e.open()
	sess := newSession(e, s)
	r := mustSessionCreate(e, sess, "sar.k", "v")
	fatal := func(what string, err error, is error) {
		e.t.Helper()
		if err == nil {
			e.t.Errorf("rule: %s is refused as Store.Create and Store.Update refuse it; no error", what)
			return
		}
		if !errors.Is(err, is) || !spate.IsFatal(err) {
			e.t.Errorf("rule: %s is a Fatal %v; got %v", what, is, err)
		}
	}
	_, err := sess.Create(e.ctx, "sar..k", []byte("v"))
	fatal("a session Create of an invalid key", err, spate.ErrInvalidKey)
	_, err = sess.Update(e.ctx, ".sar.k", []byte("v"), r)
	fatal("a session Update of an invalid key", err, spate.ErrInvalidKey)
	if limit := s.Capabilities().MaxValueSize; limit > 0 {
		_, err = sess.Create(e.ctx, "sar.big", make([]byte, limit+1))
		fatal("a session Create of a value over the cap", err, spate.ErrValueTooLarge)
		_, err = sess.Update(e.ctx, "sar.k", make([]byte, limit+1), r)
		fatal("a session Update of a value over the cap", err, spate.ErrValueTooLarge)
	}
	if o := mustSessionUpdate(e, sess, "sar.k", "zero", 0); o.Won {
		e.t.Errorf("rule: no live key is at revision 0: a session Update at 0 loses; it won")
	}
	dead, cancel := context.WithCancel(e.ctx)
	cancel()
	retryable := func(what string, err error) {
		e.t.Helper()
		if !spate.IsRetryable(err) {
			e.t.Errorf("rule: a cancelled context is Retryable; %s returned %v", what, err)
		}
	}
	_, err = sess.Create(dead, "sar.dead", []byte("v"))
	retryable("a session Create", err)
	_, err = sess.Update(dead, "sar.k", []byte("dead"), r)
	retryable("a session Update", err)
	retryable("KeepAlive", sess.KeepAlive(dead))
	expectEntry(e, s, spate.Ephemeral, "sar.k", "v", r, "refused session calls write nothing")
	expectAbsent(e, s, spate.Ephemeral, "sar.big", "refused session calls write nothing")

	// The store's Close ends its sessions.
	closing, reader := e.open(), e.open()
	cs := newSession(e, closing)
	mustSessionCreate(e, cs, "sar.closing", "v")
	if err := closing.Close(); err != nil {
		e.t.Fatalf("close: %v", err)
	}
	closed := func(what string, err error) {
		e.t.Helper()
		if !errors.Is(err, spate.ErrClosed) || !spate.IsFatal(err) {
			e.t.Errorf("rule: after the store's Close every session call fails with ErrClosed and ErrFatal; %s returned %v", what, err)
		} else if !strings.Contains(err.Error(), "closed") {
			e.t.Errorf("rule: the closed store's error says so; got %v", err)
		}
	}
	closed("KeepAlive", cs.KeepAlive(e.ctx))
	_, err = cs.Create(e.ctx, "sar.late", []byte("v"))
	closed("Create", err)
	_, err = cs.Update(e.ctx, "sar.closing", []byte("late"), 1)
	closed("Update", err)
	_, err = sessioner(e, closing).NewSession(e.ctx)
	closed("NewSession", err)
	expectAbsent(e, reader, spate.Ephemeral, "sar.closing", "the store's Close ends its sessions: their keys are deleted")
	expectAbsent(e, reader, spate.Ephemeral, "sar.late", "a session call after the store's Close writes nothing")
	e.t.Logf("bad keys and values refused Fatal, dead contexts Retryable; the store's Close deleted its session's key and closed its calls")
}
