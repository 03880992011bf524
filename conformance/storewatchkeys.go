package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spate-go/spate"
)

// The rules of the optional [spate.KeyWatcher] capability: a watch of a
// set of exact keys. A store without it skips them, with skipNoKeyWatcher
// as the reason.

// watchKeysRules are the store rules of the KeyWatcher capability;
// StoreRules ends with them.
var watchKeysRules = []Rule{
	{Name: "KeyWatcherIsReported",
		Contract: "WatchKeys reports whether the store has the optional [KeyWatcher] capability, under the same rules as UpdateAndDelete: a store that reports it implements KeyWatcher, driver.NewStore sets it when its Driver implements KeyWatcher, and a wrapper that does not pass the method on clears it.",
		body:     testKeyWatcherReported},
	{Name: "WatchKeysSnapshotHoldsTheLiveListedKeys",
		Contract: "WatchKeys streams the changes of the keys listed, in keyspace ks: first a [WatchPut] for every listed key that is live (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes of listed keys, expiry included.",
		body:     testWatchKeysSnapshot},
	{Name: "WatchKeysDeliversOnlyListedKeys",
		Contract: "It never delivers an event of a key that is not listed.",
		body:     testWatchKeysOnlyListed},
	{Name: "WatchKeysDeliversPutsDeletesAndExpiry",
		Contract: "WatchKeys streams the changes of the keys listed, in keyspace ks: first a [WatchPut] for every listed key that is live (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes of listed keys, expiry included.",
		body:     testWatchKeysLive},
	{Name: "WatchKeysHasNoGaps",
		Contract: "The rules of [Store.Watch] hold for each listed key: no gaps (the watcher's view of the listed keys converges to the store's, across the boundary between snapshot and live stream too), duplicates allowed across that boundary, superseded revisions may be coalesced, the latest revision of every key is delivered, and one key's events arrive in revision order.",
		body:     testWatchKeysNoGaps},
	{Name: "WatchKeysWatchesARepeatedKeyOnce",
		Contract: "keys holds 1 to [MaxWatchKeys] valid keys; a key listed twice is watched once.",
		body:     testWatchKeysRepeated},
	{Name: "WatchKeysArgumentsAreChecked",
		Contract: "keys holds 1 to [MaxWatchKeys] valid keys; a key listed twice is watched once.",
		body:     testWatchKeysArguments},
	{Name: "WatchKeysEndsLikeAWatch",
		Contract: "The stream ends, errors and Close are those of [Store.Watch].",
		body:     testWatchKeysEnds},
}

// skipNoKeyWatcher is the reason the KeyWatcher rules give when they skip.
const skipNoKeyWatcher = "the store does not have the optional spate.KeyWatcher capability (Capabilities.WatchKeys is false, or the store does not implement the method): its rules do not apply, and every coordinator watches the whole job"

// keyWatcher returns s's KeyWatcher, or skips the rule.
func keyWatcher(e *env, s spate.Store) spate.KeyWatcher {
	e.t.Helper()
	kw, ok := spate.KeyWatcherOf(s)
	if !ok {
		e.t.Skip(skipNoKeyWatcher)
	}
	return kw
}

func mustWatchKeys(e *env, kw spate.KeyWatcher, ks spate.Keyspace, keys ...string) <-chan spate.WatchEvent {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	ch, err := boundedWatchKeys(e, kw, ctx, ks, keys)
	if err != nil {
		e.t.Fatalf("watch-keys %s %q: unexpected error: %v", ks, keys, err)
	}
	return ch
}

// untilEvent receives until an event of key at revision rev (or above)
// arrives, failing on any event of a key not in listed; it returns the
// events received, that one included.
func untilEvent(e *env, ch <-chan spate.WatchEvent, listed map[string]bool, key string, rev uint64) []spate.WatchEvent {
	e.t.Helper()
	var got []spate.WatchEvent
	deadline := time.Now().Add(eventWait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			e.t.Fatalf("rule: a key watch delivers every change of a listed key; no event of %q at revision %d within %v", key, rev, eventWait)
		}
		ev := recvTimeout(e.t, ch, left, fmt.Sprintf("every change of a listed key (%q at %d)", key, rev))
		switch ev.Kind {
		case spate.WatchError:
			e.t.Fatalf("key watch broke while waiting for %q: %v", key, ev.Err)
		case spate.WatchSnapshotDone:
			e.t.Fatalf("rule: a key watch delivers exactly one SnapshotDone; got a second one while waiting for %q", key)
		}
		if !listed[ev.Key] {
			e.t.Fatalf("rule: a key watch never delivers an event of a key that is not listed; got %v %q@%d (listed: %v)", ev.Kind, ev.Key, ev.Revision, listed)
		}
		got = append(got, ev)
		if ev.Key == key && ev.Revision >= rev {
			return got
		}
	}
}

func set(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

func testKeyWatcherReported(e *env) {
	s := e.open()
	reported := s.Capabilities().WatchKeys
	_, implements := s.(spate.KeyWatcher)
	switch {
	case reported && !implements:
		e.t.Errorf("rule: a store that reports Capabilities.WatchKeys implements spate.KeyWatcher; %T does not (a wrapper that does not pass the method on must clear the flag)", driverOf(s))
	case !reported && implements:
		if _, ok := spate.KeyWatcherOf(s); ok {
			e.t.Errorf("rule: a store that implements KeyWatcher without reporting it is used as one without; KeyWatcherOf returned it")
		}
		e.t.Skip(skipNoKeyWatcher)
	case !reported:
		e.t.Skip(skipNoKeyWatcher)
	default:
		if _, ok := spate.KeyWatcherOf(s); !ok {
			e.t.Errorf("rule: KeyWatcherOf returns a store that reports and implements KeyWatcher; it did not")
		}
	}
}

// testWatchKeysSnapshot: of the listed keys wk.a (live), wk.b (deleted)
// and wk.c (never written), the snapshot holds wk.a only, at its revision
// and value; live unlisted keys, among them wk.ab and wk.a.x that share
// wk.a's bytes, are not in it.
func testWatchKeysSnapshot(e *env) {
	s := e.open()
	kw := keyWatcher(e, s)
	for _, ks := range keyspaces {
		ra := mustCreate(e, s, ks, "wks.a", "v-a")
		rb := mustCreate(e, s, ks, "wks.b", "v-b")
		for _, k := range []string{"wks.ab", "wks.a.x", "wks", "wks.d"} {
			mustCreate(e, s, ks, k, "unlisted")
		}
		if o := mustDelete(e, s, ks, "wks.b", rb); !o.Won {
			e.t.Fatalf("delete lost")
		}
		ch := mustWatchKeys(e, kw, ks, "wks.a", "wks.b", "wks.c")
		puts := readSnapshot(e, ch)
		got := map[string]string{}
		for _, p := range puts {
			got[p.Key] = fmt.Sprintf("%s@%d", p.Value, p.Revision)
		}
		want := map[string]string{"wks.a": fmt.Sprintf("v-a@%d", ra)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			e.t.Errorf("rule: a key watch's snapshot holds exactly the live listed keys at their values and revisions; %s snapshot %v, want %v", ks, got, want)
		}
		// Live events follow the one SnapshotDone.
		rc := mustCreate(e, s, ks, "wks.c", "v-c")
		untilEvent(e, ch, set("wks.a", "wks.b", "wks.c"), "wks.c", rc)
		e.t.Logf("%s: %d snapshot puts of 3 listed keys (6 live keys), then a live put", ks, len(puts))
	}
}

// testWatchKeysOnlyListed writes unlisted keys (some sharing a listed
// key's bytes) between writes of listed keys, and fails on any event of
// an unlisted key, in the snapshot or live, until the last listed write
// has arrived.
func testWatchKeysOnlyListed(e *env) {
	s := e.open()
	kw := keyWatcher(e, s)
	for _, ks := range keyspaces {
		listed := set("wko.k", "wko.k2")
		unlisted := []string{"wko.k1", "wko.kx", "wko.k.x", "wko", "wko.k22", "wko.j"}
		for _, k := range unlisted {
			mustCreate(e, s, ks, k, "before")
		}
		ch := mustWatchKeys(e, kw, ks, "wko.k", "wko.k2")
		for _, p := range readSnapshot(e, ch) {
			if !listed[p.Key] {
				e.t.Fatalf("rule: a key watch never delivers an event of a key that is not listed; its %s snapshot holds %q", ks, p.Key)
			}
		}
		n := 0
		for round := range 3 {
			for _, k := range unlisted {
				mustPut(e, s, ks, k, "round "+strconv.Itoa(round))
			}
			r := mustPut(e, s, ks, "wko.k", "round "+strconv.Itoa(round))
			n += len(untilEvent(e, ch, listed, "wko.k", r))
		}
		r := mustPut(e, s, ks, "wko.k2", "last")
		n += len(untilEvent(e, ch, listed, "wko.k2", r))
		e.t.Logf("%s: %d events of listed keys, none of %d unlisted keys written %d times each", ks, n, len(unlisted), 4)
	}
}

// mustPut writes key (create, or update at its current revision) and
// returns the new revision.
func mustPut(e *env, s spate.Store, ks spate.Keyspace, key, value string) uint64 {
	e.t.Helper()
	en, ok := mustGet(e, s, ks, key)
	if !ok {
		return mustCreate(e, s, ks, key, value)
	}
	o, err := s.Update(e.ctx, ks, key, []byte(value), en.Revision)
	if err != nil || !o.Won {
		e.t.Fatalf("update %s %q at %d: won=%t err=%v", ks, key, en.Revision, o.Won, err)
	}
	return o.Revision
}

// testWatchKeysLive: a listed key absent when the watch began is created,
// updated, deleted and re-created, each change written only once the one
// before it has arrived (so that none may be coalesced into the next);
// every change arrives, puts at their revisions, in order; on the
// ephemeral keyspace an untouched listed key's expiry arrives as a delete.
func testWatchKeysLive(e *env) {
	s := e.open()
	kw := keyWatcher(e, s)
	for _, ks := range keyspaces {
		ch := mustWatchKeys(e, kw, ks, "wkl.k", "wkl.other")
		readSnapshot(e, ch)
		listed := set("wkl.k", "wkl.other")
		var last uint64
		// next receives the events of wkl.k up to the one f's write
		// produced (a put at its revision, or a delete).
		next := func(what string, kind spate.WatchEventKind, f func() uint64) {
			e.t.Helper()
			rev := f()
			deadline := time.Now().Add(eventWait)
			for {
				ev := recvTimeout(e.t, ch, max(time.Until(deadline), time.Millisecond), fmt.Sprintf("the %s of a listed key", what))
				switch {
				case ev.Kind == spate.WatchError:
					e.t.Fatalf("key watch broke: %v", ev.Err)
				case !listed[ev.Key]:
					e.t.Fatalf("rule: a key watch never delivers an event of a key that is not listed; got %v %q", ev.Kind, ev.Key)
				case ev.Key != "wkl.k":
					continue
				case ev.Revision <= last:
					e.t.Fatalf("rule: one key's events arrive in revision order, each once; %s %q went %d -> %d", ks, ev.Key, last, ev.Revision)
				}
				last = ev.Revision
				if ev.Kind != kind || kind == spate.WatchPut && ev.Revision != rev {
					e.t.Fatalf("rule: a key watch delivers every put and delete of a listed key; %s: after the %s got %v@%d, want %v (at %d for a put)", ks, what, ev.Kind, ev.Revision, kind, rev)
				}
				return
			}
		}
		var rev uint64
		next("create", spate.WatchPut, func() uint64 { rev = mustCreate(e, s, ks, "wkl.k", "v1"); return rev })
		next("update", spate.WatchPut, func() uint64 {
			o, err := s.Update(e.ctx, ks, "wkl.k", []byte("v2"), rev)
			if err != nil || !o.Won {
				e.t.Fatalf("update: won=%t err=%v", o.Won, err)
			}
			rev = o.Revision
			return rev
		})
		next("delete", spate.WatchDelete, func() uint64 {
			if d := mustDelete(e, s, ks, "wkl.k", rev); !d.Won {
				e.t.Fatalf("delete lost")
			}
			return 0
		})
		next("re-create", spate.WatchPut, func() uint64 { return mustCreate(e, s, ks, "wkl.k", "v3") })
		if ks == spate.Ephemeral {
			ttlOf(e, s)
			re := mustCreate(e, s, ks, "wkl.other", "expires")
			untilEvent(e, ch, listed, "wkl.other", re)
			// wkl.k expires too, at about the same time: skip its delete.
			deadline := time.Now().Add(expiryBound(s) + eventWait/2)
			for {
				ev := recvTimeout(e.t, ch, max(time.Until(deadline), time.Millisecond), "an expiry as a delete (of the listed wkl.other)")
				if ev.Key == "wkl.k" && ev.Kind == spate.WatchDelete {
					continue
				}
				if ev.Kind != spate.WatchDelete || ev.Key != "wkl.other" || ev.Revision <= re {
					e.t.Fatalf("rule: an untouched listed ephemeral key's expiry reaches a key watch as a delete above its last put (%d); got %v %q@%d", re, ev.Kind, ev.Key, ev.Revision)
				}
				break
			}
		}
		e.t.Logf("%s: create, update, delete and re-create of a listed key arrived in order", ks)
	}
}

// testWatchKeysNoGaps writes listed and unlisted keys (some listed keys
// rewritten, some written once) in three phases around a key watch, as
// testWatchNoGaps does for a prefix: before it is opened, while it is
// being established (1 ms apart), and after SnapshotDone. The watcher's
// view of the listed keys must converge to a final read of them, each
// key's events in revision order, no unlisted key ever delivered, and the
// rule fails if the snapshot missed a listed key live before the watch or
// fewer live events arrived than the last phase wrote.
func testWatchKeysNoGaps(e *env) {
	s, writer := e.open(), e.open()
	kw := keyWatcher(e, s)
	const keys, n = 8, 120
	var names []string
	listed := map[string]bool{}
	for i := range keys {
		k := fmt.Sprintf("wkg.k%d", i)
		names = append(names, k)
		listed[k] = true
	}
	// Each write also creates a key written once, listed: a write lost at
	// the snapshot boundary is then never superseded by a later one.
	for i := 1; i <= n; i++ {
		k := fmt.Sprintf("wkg.o%03d", i)
		names = append(names, k)
		listed[k] = true
	}
	for _, ks := range keyspaces {
		revs := map[string]uint64{}
		w := startPhased(e, n, true, func(i int) (int, error) {
			k := names[i%keys]
			var o spate.Outcome
			var err error
			if revs[k] == 0 {
				o, err = writer.Create(e.ctx, ks, k, []byte(strconv.Itoa(i)))
			} else {
				// A listed key is rewritten every few writes; an
				// ephemeral one that expired meanwhile is created
				// again, one still live at another revision fails the
				// rule below.
				o, err = rewrite(e.ctx, writer, ks, k, []byte(strconv.Itoa(i)), revs[k])
			}
			if err == nil && o.Won {
				_, err = writer.Create(e.ctx, ks, fmt.Sprintf("wkg.o%03d", i), []byte("once"))
			}
			if err == nil && o.Won {
				// An unlisted key after every listed write.
				_, err = writer.Create(e.ctx, ks, fmt.Sprintf("wkg.k%d%d", i%keys, i), []byte("unlisted"))
			}
			if err != nil || !o.Won {
				return 0, fmt.Errorf("write %d of %q: won=%t err=%v", i, k, o.Won, err)
			}
			revs[k] = o.Revision
			return 2, nil
		})
		defer w.halt()
		<-w.started
		ch := mustWatchKeys(e, kw, ks, names...)
		g := newGapView(e, ks, "key watch")
		g.in = func(k string) bool { return listed[k] }
		g.atSnapshot = func(g *gapView) {
			if len(g.inSnap) == 0 {
				e.t.Fatalf("rule: a key watch's snapshot holds every live listed key; %s: listed keys were written before the watch began, the snapshot held none", ks)
			}
		}
		g.read(ch, w, func() map[string]uint64 {
			want := map[string]uint64{}
			for _, k := range names {
				if en, ok := mustGet(e, writer, ks, k); ok {
					want[k] = en.Revision
				}
			}
			return want
		})
		e.t.Logf("%s: %d snapshot puts, %d live events (%d written after SnapshotDone), %d unlisted keys written and none delivered", ks, len(g.inSnap), g.live, w.lastPhase, n)
	}
	// Writes landing while the key watch is being set up: no gap, and no
	// revision older than one already delivered.
	boundaryCheck(e, writer, "wkb.", func(keys []string) <-chan spate.WatchEvent { return mustWatchKeys(e, kw, spate.Durable, keys...) }, true, true)
}

// testWatchKeysRepeated: with wkr.k listed twice, its snapshot put and each
// of its two later changes arrive once (the first may be coalesced into the
// second, as the Watch contract allows; NATS R3 did so under load). On the
// ephemeral keyspace the key can expire before a write (a loaded R3
// cluster took that long to set the watch up: it delivered the expiry's
// delete, then the re-create and the update, and the rule, which expected
// two puts, failed); then each change must still arrive once, in order.
func testWatchKeysRepeated(e *env) {
	s := e.open()
	kw := keyWatcher(e, s)
	for _, ks := range keyspaces {
		r0 := mustCreate(e, s, ks, "wkr.k", "v0")
		ch := mustWatchKeys(e, kw, ks, "wkr.k", "wkr.j", "wkr.k")
		if puts := readSnapshot(e, ch); len(puts) != 1 || puts[0].Revision != r0 {
			e.t.Errorf("rule: a key listed twice is watched once; its %s snapshot holds %d puts (%v), want one at %d", ks, len(puts), puts, r0)
		}
		// On the ephemeral keyspace the key may expire (one TTL after its
		// create) before a write below reaches it, on a slow machine or
		// cluster: mustPut then creates it again, and its expiry is a
		// change of its own, a delete, that the watch delivers first.
		put := func(v string) (uint64, bool) {
			e.t.Helper()
			en, live := mustGet(e, s, ks, "wkr.k")
			if !live {
				return mustCreate(e, s, ks, "wkr.k", v), false
			}
			o, err := s.Update(e.ctx, ks, "wkr.k", []byte(v), en.Revision)
			if err != nil || !o.Won {
				e.t.Fatalf("update %s %q at %d: won=%t err=%v", ks, "wkr.k", en.Revision, o.Won, err)
			}
			return o.Revision, true
		}
		r1, liveBefore1 := put("v1")
		r2, liveBefore2 := put("v2")
		var revs []uint64
		var kinds []spate.WatchEventKind
		for _, ev := range untilEvent(e, ch, set("wkr.k", "wkr.j"), "wkr.k", r2) {
			revs = append(revs, ev.Revision)
			kinds = append(kinds, ev.Kind)
		}
		if liveBefore1 && liveBefore2 {
			// r1 may be coalesced into r2 (superseded before it was
			// delivered); what may not happen is a change arriving twice.
			if got := fmt.Sprint(revs); got != fmt.Sprint([]uint64{r1, r2}) && got != fmt.Sprint([]uint64{r2}) {
				e.t.Errorf("rule: a key listed twice is watched once: each change arrives once; %s got revisions %v, want %v (or %v, coalesced)", ks, revs, []uint64{r1, r2}, []uint64{r2})
			}
			continue
		}
		// The key expired on the way: besides r1 and r2, an expiry's delete
		// may come, each change once, in revision order.
		e.t.Logf("%s: wkr.k expired before a write (live before the first: %t, before the second: %t); events %v at revisions %v", ks, liveBefore1, liveBefore2, kinds, revs)
		for i, rev := range revs {
			if i > 0 && rev <= revs[i-1] {
				e.t.Errorf("rule: a key listed twice is watched once: each change arrives once; %s got revisions %v (kinds %v), one not after the one before", ks, revs, kinds)
				break
			}
			if kinds[i] == spate.WatchPut && rev != r1 && rev != r2 {
				e.t.Errorf("rule: a key listed twice is watched once: each change arrives once; %s got a put at %d, not one of the writes %d, %d (revisions %v)", ks, rev, r1, r2, revs)
			}
		}
	}
}

func testWatchKeysArguments(e *env) {
	s := e.open()
	kw := keyWatcher(e, s)
	fatal := func(what string, keys []string) {
		e.t.Helper()
		ch, err := boundedWatchKeys(e, kw, e.ctx, spate.Durable, keys)
		if err == nil {
			drain(ch)
			e.t.Errorf("rule: a key watch of %s is a Fatal error; it was established", what)
			return
		}
		if !errors.Is(err, spate.ErrFatal) {
			e.t.Errorf("rule: a key watch of %s is a Fatal error; got %v", what, err)
		}
	}
	fatal("no keys", nil)
	many := make([]string, spate.MaxWatchKeys+1)
	for i := range many {
		many[i] = fmt.Sprintf("wka.k%04d", i)
	}
	fatal("more than MaxWatchKeys keys", many)
	fatal("an invalid key", []string{"wka.ok", "bad key"})

	// MaxWatchKeys keys are watched: the last one's change arrives.
	ch := mustWatchKeys(e, kw, spate.Durable, many[:spate.MaxWatchKeys]...)
	readSnapshot(e, ch)
	r := mustCreate(e, s, spate.Durable, many[spate.MaxWatchKeys-1], "v")
	untilEvent(e, ch, set(many[:spate.MaxWatchKeys]...), many[spate.MaxWatchKeys-1], r)

	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	start := time.Now()
	ch2, err := boundedWatchKeys(e, kw, ctx, spate.Durable, []string{"wka.k"})
	switch {
	case err == nil:
		drain(ch2)
		e.t.Errorf("rule: a key watch under a cancelled context fails Retryable at once; it was established")
	case !errors.Is(err, spate.ErrRetryable):
		e.t.Errorf("rule: a key watch under a cancelled context fails Retryable; got %v", err)
	case time.Since(start) > eventWait/2:
		e.t.Errorf("rule: a key watch under a cancelled context fails at once; it took %v", time.Since(start))
	}
}

// drain reads ch in the background until it closes.
func drain(ch <-chan spate.WatchEvent) {
	go func() {
		for range ch {
		}
	}()
}

// testWatchKeysEnds: a key watch closes within eventWait of its context's
// cancellation, and another within eventWait of its store's Close (after
// a WatchError or nothing), each once seen live.
func testWatchKeysEnds(e *env) {
	writer := e.open()
	for _, byClose := range []bool{false, true} {
		s := e.open()
		kw := keyWatcher(e, s)
		ctx, cancel := context.WithCancel(e.ctx)
		ch, err := boundedWatchKeys(e, kw, ctx, spate.Durable, []string{"wke.k"})
		if err != nil {
			cancel()
			e.t.Fatalf("watch-keys: %v", err)
		}
		readSnapshot(e, ch)
		r := mustPut(e, writer, spate.Durable, "wke.k", "v")
		untilEvent(e, ch, set("wke.k"), "wke.k", r)
		how := "its context was cancelled"
		if byClose {
			how = "its store was closed"
			_ = s.Close()
		} else {
			cancel()
		}
		deadline := time.NewTimer(eventWait)
	wait:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break wait
				}
				if ev.Kind != spate.WatchError {
					continue // events already on their way may still arrive
				}
			case <-deadline.C:
				cancel()
				e.t.Fatalf("rule: a key watch ends when %s: its channel did not close within %v", how, eventWait)
			}
		}
		deadline.Stop()
		cancel()
	}
}
