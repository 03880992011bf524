package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
)

// StoreRules are the rules of [RunStore] and [CheckStore], in the order they
// run: each checks one sentence of the store contract (see the package
// documentation for the sentences and their rules).
var StoreRules = []Rule{
	{Name: "CapabilitiesReported",
		Contract: "Capabilities reports what the driver promises.",
		body:     testCapabilities},
	{Name: "CreateIsCreateIfAbsent",
		Contract: "Create writes key if it is absent (deleted and expired keys are absent) and returns Won with the new revision; if the key exists it returns Lost and writes nothing.",
		body:     testCreateIfAbsent},
	{Name: "UpdateIsCompareAndSwap",
		Contract: "Update writes key only if it currently exists at exactly revision expected, returning Won with a strictly larger revision; otherwise Lost.",
		body:     testUpdateCAS},
	{Name: "RevisionsIncreaseAcrossDeleteAndRecreate",
		Contract: "It strictly increases per key across the key's whole history, including delete and re-create (a keyspace- or store-wide counter does this; a per-key version that restarts on re-create does not).",
		body:     testRevisionsMonotone},
	{Name: "GuardedDelete",
		Contract: "Otherwise it is guarded: it wins only if the key exists at exactly expected, and a guarded delete of an absent key loses.",
		body:     testGuardedDelete},
	{Name: "DeletedKeysReadAbsentAndAreRecreatable",
		Contract: "ok is false for an absent key; a deleted or expired key is absent, never a tombstone.",
		body:     testDeletedAbsent},
	{Name: "ExpiredKeysReadAbsentAndAreRecreatable",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testExpiredAbsent},
	{Name: "HeartbeatedEphemeralKeySurvives",
		Contract: "On the ephemeral keyspace a won Update re-arms the key's TTL: it is the heartbeat.",
		body:     testHeartbeatSurvives},
	{Name: "UpdatedEphemeralKeyExpiresAfterItsTTL",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testUpdatedExpires},
	{Name: "LostUpdateDoesNotRearmTheTTL",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testLostUpdateNoRearm},
	{Name: "ExpiryReachesWatchersAsDelete",
		Contract: "A key expires at one instant between its deadline and [Capabilities.ExpiryLatency] after it, for every primitive alike: from then on it is absent to all of them, and watchers receive a [WatchDelete].",
		body:     testExpiryWatch},
	{Name: "DurableKeysNeverExpire",
		Contract: "[Durable] keys never expire.",
		body:     testDurableNeverExpires},
	{Name: "WatchSnapshotThenOneSnapshotDone",
		Contract: "Watch streams changes under prefix: first a [WatchPut] for every live key (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes, expiry included.",
		body:     testWatchSnapshot},
	{Name: "WatchFiltersByPrefix",
		Contract: "Watch streams changes under prefix: first a [WatchPut] for every live key (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes, expiry included.",
		body:     testWatchPrefix},
	{Name: "WatchDeliversDeletes",
		Contract: "A delete has a revision too, greater than every revision the key held before, and watchers receive it.",
		body:     testWatchDeletes},
	{Name: "WatchHasNoGaps",
		Contract: "There are no gaps: the watcher's view always converges to the store's state, across the boundary between snapshot and live stream too.",
		body:     testWatchNoGaps},
	{Name: "ListReturnsLiveKeys",
		Contract: "List returns every live key under prefix with value and revision, sorted by key.",
		body:     testListLive},
	{Name: "ListNeverUnderReports",
		Contract: "It never under-reports a key that was live for the whole call: the coordinator treats absence from a listing as a delete.",
		body:     testListNeverUnderReports},
	{Name: "ConcurrentCASLosesNoUpdate",
		Contract: "The coordinator needs nothing else, and it trusts nothing else: fencing rests on Create and Update being linearizable compare-and-set operations.",
		body:     testConcurrentCAS},
	{Name: "CancelledContextIsRetryable",
		Contract: "Retryable: timeouts, transport failures, a cancelled or expired context, a broken or lagged watch.",
		body:     testCancelledContext},
	{Name: "CancelledWatchEndsAndCloses",
		Contract: "The stream ends, and the channel closes, when ctx is cancelled, the store is closed, or the stream breaks.",
		body:     testCancelledWatch},
	{Name: "ValueSizeCap",
		Contract: "ErrValueTooLarge is returned (with ErrFatal) by a store write whose value exceeds the store's reported cap; nothing was written.",
		body:     testValueCap},
	{Name: "InvalidKeysRejected",
		Contract: "ErrInvalidKey is returned (with ErrFatal) for a key or prefix outside the store key syntax; nothing was written.",
		body:     testInvalidKeys},
	{Name: "ValuesRoundTrip",
		Contract: "WatchPut: Key was written at Revision with Value.",
		body:     testValuesRoundTrip},
	{Name: "KeyspacesAreIndependent",
		Contract: "Keyspace selects one of the store's two keyspaces.",
		body:     testKeyspacesIndependent},
	{Name: "ClientsShareOneNamespace",
		Contract: "The coordinator needs nothing else, and it trusts nothing else: fencing rests on Create and Update being linearizable compare-and-set operations.",
		body:     testClientsShare},
	{Name: "UseAfterClose",
		Contract: "After Close every method returns an error matching both [ErrClosed] and [ErrFatal].",
		body:     testUseAfterClose},
}

// eventWait bounds waits for live watch events that need no expiry.
const eventWait = 10 * time.Second

// RunStore runs the store rules (see [StoreRules]) against the driver
// behind newHarness, one subtest each. Subtests run in parallel, each on
// its own harness.
func RunStore(t *testing.T, newHarness HarnessMaker, opts ...Option) {
	runRules(t, "Store", StoreRules, newHarness, opts)
}

var keyspaces = []spate.Keyspace{spate.Durable, spate.Ephemeral}

func mustCreate(e *env, s spate.Store, ks spate.Keyspace, key, value string) uint64 {
	e.t.Helper()
	o, err := s.Create(e.ctx, ks, key, []byte(value))
	if err != nil {
		e.t.Fatalf("create %s %q: unexpected error: %v", ks, key, err)
	}
	if !o.Won {
		e.t.Fatalf("rule: create of an absent key wins; create %s %q lost", ks, key)
	}
	if o.Revision == 0 {
		e.t.Fatalf("rule: a live key's revision is never 0; create %s %q won at 0", ks, key)
	}
	return o.Revision
}

func mustGet(e *env, s spate.Store, ks spate.Keyspace, key string) (spate.Entry, bool) {
	e.t.Helper()
	en, ok, err := s.Get(e.ctx, ks, key)
	if err != nil {
		e.t.Fatalf("get %s %q: unexpected error: %v", ks, key, err)
	}
	return en, ok
}

func mustUpdate(e *env, s spate.Store, ks spate.Keyspace, key, value string, rev uint64) spate.Outcome {
	e.t.Helper()
	o, err := s.Update(e.ctx, ks, key, []byte(value), rev)
	if err != nil {
		e.t.Fatalf("update %s %q: unexpected error: %v", ks, key, err)
	}
	return o
}

func mustDelete(e *env, s spate.Store, ks spate.Keyspace, key string, rev uint64) spate.Outcome {
	e.t.Helper()
	o, err := s.Delete(e.ctx, ks, key, rev)
	if err != nil {
		e.t.Fatalf("delete %s %q: unexpected error: %v", ks, key, err)
	}
	return o
}

func mustWatch(e *env, s spate.Store, ks spate.Keyspace, prefix string) <-chan spate.WatchEvent {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	ch, err := s.Watch(ctx, ks, prefix)
	if err != nil {
		e.t.Fatalf("watch %s %q: unexpected error: %v", ks, prefix, err)
	}
	return ch
}

// readSnapshot collects the snapshot puts up to SnapshotDone.
func readSnapshot(e *env, ch <-chan spate.WatchEvent) []spate.WatchEvent {
	e.t.Helper()
	var puts []spate.WatchEvent
	for {
		ev := recvTimeout(e.t, ch, eventWait, "the snapshot")
		switch ev.Kind {
		case spate.WatchPut:
			puts = append(puts, ev)
		case spate.WatchSnapshotDone:
			return puts
		case spate.WatchError:
			e.t.Fatalf("watch broke during the snapshot: %v", ev.Err)
		default:
			e.t.Fatalf("rule: a snapshot holds only puts, then SnapshotDone; got %v %q", ev.Kind, ev.Key)
		}
	}
}

// expectEvent receives events until one for key arrives and returns it;
// events for other keys are returned in skipped.
func expectEvent(e *env, ch <-chan spate.WatchEvent, key string, wait time.Duration) spate.WatchEvent {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			e.t.Fatalf("no watch event for %q within %v", key, wait)
		}
		ev := recvTimeout(e.t, ch, left, fmt.Sprintf("an event for %q", key))
		if ev.Kind == spate.WatchError {
			e.t.Fatalf("watch broke while waiting for %q: %v", key, ev.Err)
		}
		if ev.Kind == spate.WatchSnapshotDone {
			e.t.Fatalf("rule: a watch delivers exactly one SnapshotDone; got a second one while waiting for %q", key)
		}
		if ev.Key == key {
			return ev
		}
	}
}

func ttlOf(e *env, s spate.Store) time.Duration {
	e.t.Helper()
	ttl := s.Capabilities().TTL
	if ttl <= 0 {
		e.t.Fatalf("rule: a store reports its ephemeral TTL; got %v", ttl)
	}
	return ttl
}

// expiryBound is how long after its last write an untouched ephemeral key
// may still be visible: the TTL, the driver's reported expiry latency, and
// scheduling slack.
func expiryBound(s spate.Store) time.Duration {
	c := s.Capabilities()
	return c.TTL + c.ExpiryLatency + max(c.TTL/2, 500*time.Millisecond)
}

func testCapabilities(e *env) {
	s := e.open()
	c := s.Capabilities()
	if c.Driver == "" {
		e.t.Errorf("rule: a store names its driver; Capabilities.Driver is empty")
	}
	if c.TTL <= 0 {
		e.t.Errorf("rule: a store reports its ephemeral TTL; got %v", c.TTL)
	}
	if c.TTLFloor < 0 || c.TTL < c.TTLFloor {
		e.t.Errorf("rule: the TTL is at least the reported floor; TTL %v, floor %v", c.TTL, c.TTLFloor)
	}
	if c.ExpiryLatency < 0 || c.MaxValueSize < 0 {
		e.t.Errorf("rule: expiry latency and value cap are not negative; got %v and %d", c.ExpiryLatency, c.MaxValueSize)
	}
}

func testCreateIfAbsent(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		rev := mustCreate(e, s, ks, "cia.k", "first")
		o, err := s.Create(e.ctx, ks, "cia.k", []byte("second"))
		if err != nil {
			e.t.Fatalf("second create: unexpected error: %v", err)
		}
		if o.Won {
			e.t.Errorf("rule: create is create-if-absent; a second create of %s %q won", ks, "cia.k")
		}
		en, ok := mustGet(e, s, ks, "cia.k")
		if !ok || string(en.Value) != "first" || en.Revision != rev {
			e.t.Errorf("rule: a lost create writes nothing; %s %q reads %q@%d (present %t), want %q@%d",
				ks, "cia.k", en.Value, en.Revision, ok, "first", rev)
		}
	}
}

func testUpdateCAS(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		r1 := mustCreate(e, s, ks, "cas.k", "v1")
		if en, ok := mustGet(e, s, ks, "cas.k"); !ok || string(en.Value) != "v1" || en.Revision != r1 {
			e.t.Errorf("rule: get returns the latest value and revision; %s reads %q@%d (present %t), want %q@%d", ks, en.Value, en.Revision, ok, "v1", r1)
		}
		o := mustUpdate(e, s, ks, "cas.k", "v2", r1)
		if !o.Won {
			e.t.Fatalf("rule: update at the current revision wins; %s update at %d lost", ks, r1)
		}
		if o.Revision <= r1 {
			e.t.Errorf("rule: a won update mints a strictly larger revision; %s %d -> %d", ks, r1, o.Revision)
		}
		r2 := o.Revision
		if stale := mustUpdate(e, s, ks, "cas.k", "stale", r1); stale.Won {
			e.t.Errorf("rule: update at a stale revision loses; %s update at %d (current %d) won", ks, r1, r2)
		}
		if future := mustUpdate(e, s, ks, "cas.k", "future", r2+1000); future.Won {
			e.t.Errorf("rule: update wins only at the exact revision; %s update at %d (current %d) won", ks, r2+1000, r2)
		}
		en, ok := mustGet(e, s, ks, "cas.k")
		if !ok || string(en.Value) != "v2" || en.Revision != r2 {
			e.t.Errorf("rule: get returns the latest value and revision and lost updates write nothing; %s reads %q@%d, want %q@%d",
				ks, en.Value, en.Revision, "v2", r2)
		}
		if absent := mustUpdate(e, s, ks, "cas.absent", "x", r2); absent.Won {
			e.t.Errorf("rule: update of an absent key loses; %s update of %q won", ks, "cas.absent")
		}
		if _, ok := mustGet(e, s, ks, "cas.absent"); ok {
			e.t.Errorf("rule: update never creates; %s %q exists after a lost update", ks, "cas.absent")
		}
	}
}

func testRevisionsMonotone(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "mono.")
		readSnapshot(e, ch)
		var revs []uint64
		r := mustCreate(e, s, ks, "mono.k", "a")
		revs = append(revs, r)
		o := mustUpdate(e, s, ks, "mono.k", "b", r)
		if !o.Won {
			e.t.Fatalf("update at current revision lost")
		}
		revs = append(revs, o.Revision)
		if d := mustDelete(e, s, ks, "mono.k", o.Revision); !d.Won {
			e.t.Fatalf("guarded delete at the current revision lost")
		}
		// The delete's revision reaches watchers.
		var delRev uint64
		for range 3 {
			ev := expectEvent(e, ch, "mono.k", eventWait)
			if ev.Kind == spate.WatchDelete {
				delRev = ev.Revision
				break
			}
		}
		if delRev == 0 {
			e.t.Fatalf("rule: a delete reaches watchers with its revision; no delete event for %s %q", ks, "mono.k")
		}
		revs = append(revs, delRev)
		r3 := mustCreate(e, s, ks, "mono.k", "c")
		revs = append(revs, r3)
		if !strictlyIncreasing(revs) {
			e.t.Errorf("rule: revisions strictly increase per key across delete and re-create (a per-key version that restarts is wrong); %s create, update, delete, re-create minted %v",
				ks, revs)
		}
	}
}

func strictlyIncreasing(revs []uint64) bool {
	for i := 1; i < len(revs); i++ {
		if revs[i] <= revs[i-1] {
			return false
		}
	}
	return true
}

func testGuardedDelete(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		r := mustCreate(e, s, ks, "gd.k", "v")
		if o := mustDelete(e, s, ks, "gd.k", r+1000); o.Won {
			e.t.Errorf("rule: a guarded delete at the wrong revision loses; %s delete at %d (current %d) won", ks, r+1000, r)
		}
		if _, ok := mustGet(e, s, ks, "gd.k"); !ok {
			e.t.Fatalf("rule: a lost guarded delete removes nothing; %s %q is gone", ks, "gd.k")
		}
		if o := mustDelete(e, s, ks, "gd.k", r); !o.Won {
			e.t.Errorf("rule: a guarded delete at the current revision wins; %s delete at %d lost", ks, r)
		}
		if _, ok := mustGet(e, s, ks, "gd.k"); ok {
			e.t.Errorf("rule: a won delete removes the key; %s %q still reads present", ks, "gd.k")
		}
		if o := mustDelete(e, s, ks, "gd.k", r); o.Won {
			e.t.Errorf("rule: a guarded delete of an absent key loses; %s delete of absent %q at %d won", ks, "gd.k", r)
		}
		if o := mustDelete(e, s, ks, "gd.never", spate.AnyRevision); !o.Won {
			e.t.Errorf("rule: an unguarded delete of an absent key wins vacuously; %s delete of %q lost", ks, "gd.never")
		}
		r2 := mustCreate(e, s, ks, "gd.any", "v")
		_ = r2
		if o := mustDelete(e, s, ks, "gd.any", spate.AnyRevision); !o.Won {
			e.t.Errorf("rule: an unguarded delete of a live key wins; %s delete of %q lost", ks, "gd.any")
		}
		if _, ok := mustGet(e, s, ks, "gd.any"); ok {
			e.t.Errorf("rule: a won delete removes the key; %s %q still reads present", ks, "gd.any")
		}
	}
}

func testDeletedAbsent(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		r := mustCreate(e, s, ks, "del.k", "v")
		mustCreate(e, s, ks, "del.other", "v")
		if o := mustDelete(e, s, ks, "del.k", r); !o.Won {
			e.t.Fatalf("delete lost")
		}
		if en, ok := mustGet(e, s, ks, "del.k"); ok {
			e.t.Errorf("rule: a deleted key reads absent, never as a tombstone; %s %q reads %q@%d", ks, "del.k", en.Value, en.Revision)
		}
		list, err := s.List(e.ctx, ks, "del.")
		if err != nil {
			e.t.Fatalf("list: %v", err)
		}
		for _, en := range list {
			if en.Key == "del.k" {
				e.t.Errorf("rule: a deleted key is not listed; %s list shows %q", ks, en.Key)
			}
		}
		o, err := s.Create(e.ctx, ks, "del.k", []byte("again"))
		if err != nil {
			e.t.Fatalf("re-create: %v", err)
		}
		if !o.Won {
			e.t.Errorf("rule: a deleted key is re-creatable; %s re-create of %q lost", ks, "del.k")
		} else if o.Revision <= r {
			e.t.Errorf("rule: a re-created key's revision exceeds its old ones; %s %d -> %d", ks, r, o.Revision)
		}
	}
}

func testExpiredAbsent(e *env) {
	s := e.open()
	ttlOf(e, s)
	r := mustCreate(e, s, spate.Ephemeral, "exp.k", "v")
	time.Sleep(expiryBound(s))
	if en, ok := mustGet(e, s, spate.Ephemeral, "exp.k"); ok {
		e.t.Errorf("rule: an ephemeral key untouched for its TTL (%v, expiry latency %v) reads absent; %q still reads %q@%d",
			s.Capabilities().TTL, s.Capabilities().ExpiryLatency, "exp.k", en.Value, en.Revision)
	}
	list, err := s.List(e.ctx, spate.Ephemeral, "exp.")
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	if len(list) != 0 {
		e.t.Errorf("rule: an expired key is not listed; list shows %d entries (first %q)", len(list), list[0].Key)
	}
	o, err := s.Create(e.ctx, spate.Ephemeral, "exp.k", []byte("again"))
	if err != nil {
		e.t.Fatalf("re-create: %v", err)
	}
	if !o.Won {
		e.t.Errorf("rule: an expired key is re-creatable; re-create of %q lost", "exp.k")
	} else if o.Revision <= r {
		e.t.Errorf("rule: a re-created key's revision exceeds its old ones; %d -> %d", r, o.Revision)
	}
}

func testHeartbeatSurvives(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	rev := mustCreate(e, s, spate.Ephemeral, "hb.k", "beat-0")
	start := time.Now()
	for i := 1; time.Since(start) < 3*ttl; i++ {
		time.Sleep(ttl / 3)
		o := mustUpdate(e, s, spate.Ephemeral, "hb.k", "beat-"+strconv.Itoa(i), rev)
		if !o.Won {
			e.t.Fatalf("rule: every won update re-arms the TTL, so a key rewritten every TTL/3 lives on; update %d at %v (TTL %v) lost",
				i, time.Since(start).Round(time.Millisecond), ttl)
		}
		rev = o.Revision
	}
	if _, ok := mustGet(e, s, spate.Ephemeral, "hb.k"); !ok {
		e.t.Errorf("rule: a key rewritten every TTL/3 survives 3 TTLs; %q is gone", "hb.k")
	}
}

// testUpdatedExpires: a key created, then updated halfway through its
// TTL, is still there most of a TTL after the update (the update re-armed
// the TTL, in full: not rounded down, not left running from the create),
// and gone once the TTL after the update has passed (the update did not
// make it permanent: SET without KEEPTTL and an expiry, a put without the
// lease).
func testUpdatedExpires(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	rev := mustCreate(e, s, spate.Ephemeral, "upd.k", "v0")
	time.Sleep(ttl / 2)
	o := mustUpdate(e, s, spate.Ephemeral, "upd.k", "v1", rev)
	if !o.Won {
		e.t.Fatalf("update of a live key at its revision lost")
	}
	updated := time.Now()
	time.Sleep(ttl * 7 / 10)
	if _, ok := mustGet(e, s, spate.Ephemeral, "upd.k"); !ok {
		e.t.Errorf("rule: a won update re-arms the whole TTL; %q was gone %v after its update (TTL %v): the TTL ran from the create, or was rounded down",
			"upd.k", time.Since(updated).Round(time.Millisecond), ttl)
	}
	time.Sleep(time.Until(updated.Add(expiryBound(s))))
	if en, ok := mustGet(e, s, spate.Ephemeral, "upd.k"); ok {
		e.t.Errorf("rule: an updated ephemeral key still expires a TTL after its last write; %q still reads %q@%d %v after its update (TTL %v)",
			"upd.k", en.Value, en.Revision, time.Since(updated).Round(time.Millisecond), ttl)
	}
}

// testLostUpdateNoRearm: updates at a stale revision, every TTL/3, lose
// and must not re-arm the TTL: the key expires a TTL after its one real
// write, however long the stale updates go on.
func testLostUpdateNoRearm(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	rev := mustCreate(e, s, spate.Ephemeral, "lost.k", "v0")
	written := time.Now()
	deadline := written.Add(expiryBound(s) + ttl/3)
	for i := 1; time.Now().Before(deadline); i++ {
		time.Sleep(ttl / 3)
		if o := mustUpdate(e, s, spate.Ephemeral, "lost.k", "stale-"+strconv.Itoa(i), rev+1000); o.Won {
			e.t.Fatalf("rule: an update at a wrong revision loses; update %d at %d won", i, rev+1000)
		}
	}
	if en, ok := mustGet(e, s, spate.Ephemeral, "lost.k"); ok {
		e.t.Errorf("rule: a lost update writes nothing, not even the TTL; %q still reads %q@%d %v after its only write (TTL %v)",
			"lost.k", en.Value, en.Revision, time.Since(written).Round(time.Millisecond), ttl)
	}
}

func testExpiryWatch(e *env) {
	s := e.open()
	ttlOf(e, s)
	ch := mustWatch(e, s, spate.Ephemeral, "ew.")
	readSnapshot(e, ch)
	r := mustCreate(e, s, spate.Ephemeral, "ew.k", "v")
	put := expectEvent(e, ch, "ew.k", eventWait)
	if put.Kind != spate.WatchPut || put.Revision != r {
		e.t.Fatalf("rule: a create reaches watchers as a put at its revision; got %v@%d, want put@%d", put.Kind, put.Revision, r)
	}
	bound := expiryBound(s)
	ev := recvTimeout(e.t, ch, bound+eventWait/2, "the expiry of ew.k")
	if ev.Kind != spate.WatchDelete || ev.Key != "ew.k" {
		e.t.Fatalf("rule: an untouched ephemeral key's expiry reaches watchers as a delete; got %v %q", ev.Kind, ev.Key)
	}
	if ev.Revision <= r {
		e.t.Errorf("rule: an expiry delete carries a revision above the key's last put; %d <= %d", ev.Revision, r)
	}
}

func testDurableNeverExpires(e *env) {
	s := e.open()
	ttlOf(e, s)
	r := mustCreate(e, s, spate.Durable, "dur.k", "v")
	time.Sleep(2 * expiryBound(s))
	en, ok := mustGet(e, s, spate.Durable, "dur.k")
	if !ok || en.Revision != r {
		e.t.Errorf("rule: durable keys never expire; %q is gone (or changed) after two TTLs", "dur.k")
	}
}

func testWatchSnapshot(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		want := map[string]uint64{}
		for _, k := range []string{"snap.a", "snap.b", "snap.c"} {
			want[k] = mustCreate(e, s, ks, k, "v-"+k)
		}
		if o := mustDelete(e, s, ks, "snap.b", want["snap.b"]); !o.Won {
			e.t.Fatalf("delete lost")
		}
		delete(want, "snap.b")
		ch := mustWatch(e, s, ks, "snap.")
		puts := readSnapshot(e, ch)
		got := map[string]uint64{}
		for _, p := range puts {
			got[p.Key] = p.Revision
			if string(p.Value) != "v-"+p.Key {
				e.t.Errorf("rule: snapshot puts carry the key's value; %q has %q", p.Key, p.Value)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			e.t.Errorf("rule: the snapshot holds exactly the live keys at their revisions; %s snapshot %v, want %v", ks, got, want)
		}
		// Live events follow, and no second SnapshotDone.
		r := mustCreate(e, s, ks, "snap.d", "v")
		ev := expectEvent(e, ch, "snap.d", eventWait)
		if ev.Kind != spate.WatchPut || ev.Revision != r {
			e.t.Errorf("rule: live puts follow the snapshot; got %v@%d, want put@%d", ev.Kind, ev.Revision, r)
		}
	}
}

func testWatchPrefix(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		mustCreate(e, s, ks, "pf.in.a", "v")
		mustCreate(e, s, ks, "pf.out.a", "v")
		mustCreate(e, s, ks, "pf.inx", "v") // shares a byte prefix only
		ch := mustWatch(e, s, ks, "pf.in.")
		for _, p := range readSnapshot(e, ch) {
			if !strings.HasPrefix(p.Key, "pf.in.") {
				e.t.Errorf("rule: a watch delivers only keys under its prefix; %s snapshot of %q holds %q", ks, "pf.in.", p.Key)
			}
		}
		mustCreate(e, s, ks, "pf.out.b", "v")
		mustCreate(e, s, ks, "pf.in.b", "v")
		ev := recvTimeout(e.t, ch, eventWait, "a live event")
		if ev.Key != "pf.in.b" {
			e.t.Errorf("rule: a watch delivers only keys under its prefix; %s live event for %q on prefix %q", ks, ev.Key, "pf.in.")
		}
	}
}

func testWatchDeletes(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "wd.")
		readSnapshot(e, ch)
		r := mustCreate(e, s, ks, "wd.k", "v")
		expectEvent(e, ch, "wd.k", eventWait)
		if o := mustDelete(e, s, ks, "wd.k", r); !o.Won {
			e.t.Fatalf("delete lost")
		}
		ev := expectEvent(e, ch, "wd.k", eventWait)
		if ev.Kind != spate.WatchDelete {
			e.t.Fatalf("rule: an explicit delete reaches watchers as a delete; got %v", ev.Kind)
		}
		if ev.Revision <= r {
			e.t.Errorf("rule: a delete event's revision exceeds the key's last put; %d <= %d", ev.Revision, r)
		}
	}
}

// testWatchNoGaps opens a watch while a writer is busy creating, updating
// and deleting keys, and checks that the watcher's view converges to the
// store's state (nothing missed), with each key's events in revision order.
// Intermediate revisions of one key superseded before delivery may be
// coalesced; the latest never is.
// testWatchNoGaps writes in three phases around a watch: a third before it
// is opened (the snapshot must hold it), a third while it is being
// established (either side of the snapshot boundary), and a third only
// after the watcher has seen SnapshotDone (these must arrive live). The
// watcher's view must converge to a final listing, every key's events must
// come in revision order, and the rule proves it exercised the live side:
// it fails if fewer live events arrived than the last phase wrote.
func testWatchNoGaps(e *env) {
	s := e.open()
	writer := e.open()
	const n = 150
	for _, ks := range keyspaces {
		rev := mustCreate(e, writer, ks, "gap.counter", "0")
		started := make(chan struct{})
		snapSeen := make(chan struct{})
		done := make(chan error, 1)
		lastPhaseEvents := 0
		go func() {
			defer close(done)
			for i := 1; i <= n; i++ {
				switch i {
				case n / 3:
					close(started)
				case 2 * n / 3:
					select {
					case <-snapSeen:
					case <-e.ctx.Done():
						done <- e.ctx.Err()
						return
					}
				}
				o, err := writer.Update(e.ctx, ks, "gap.counter", []byte(strconv.Itoa(i)), rev)
				if err != nil || !o.Won {
					done <- fmt.Errorf("update %d: won=%t err=%v", i, o.Won, err)
					return
				}
				rev = o.Revision
				k := fmt.Sprintf("gap.k%03d", i)
				c, err := writer.Create(e.ctx, ks, k, []byte("v"))
				if err != nil {
					done <- err
					return
				}
				events := 2
				if i%10 == 0 {
					if _, err := writer.Delete(e.ctx, ks, k, c.Revision); err != nil {
						done <- err
						return
					}
					events++
				}
				if i >= 2*n/3 {
					lastPhaseEvents += events
				}
			}
		}()
		<-started
		ch := mustWatch(e, s, ks, "gap.")
		var want map[string]uint64 // the final listing, once the writer is done
		view := map[string]uint64{}
		last := map[string]uint64{}
		snapshotDone, live := false, 0
		converged := func() bool {
			if want == nil || !snapshotDone || len(view) != len(want) {
				return false
			}
			for k, r := range want {
				if view[k] != r {
					return false
				}
			}
			return true
		}
		writerDone := done
		timer := time.NewTimer(eventWait)
		for !converged() {
			select {
			case err := <-writerDone:
				if err != nil {
					e.t.Fatalf("writer: %v", err)
				}
				writerDone = nil
				final, err := s.List(e.ctx, ks, "gap.")
				if err != nil {
					e.t.Fatalf("list: %v", err)
				}
				want = map[string]uint64{}
				for _, en := range final {
					want[en.Key] = en.Revision
				}
				timer.Reset(eventWait)
			case ev, ok := <-ch:
				if !ok {
					e.t.Fatalf("watch closed")
				}
				switch ev.Kind {
				case spate.WatchSnapshotDone:
					if !snapshotDone {
						snapshotDone = true
						close(snapSeen)
					}
				case spate.WatchError:
					e.t.Fatalf("watch broke: %v", ev.Err)
				case spate.WatchPut, spate.WatchDelete:
					if ev.Revision < last[ev.Key] {
						e.t.Fatalf("rule: a key's events arrive in revision order; %s %q went %d -> %d", ks, ev.Key, last[ev.Key], ev.Revision)
					}
					last[ev.Key] = ev.Revision
					if snapshotDone {
						live++
					}
					if ev.Kind == spate.WatchPut {
						view[ev.Key] = ev.Revision
					} else {
						delete(view, ev.Key)
					}
				}
			case <-timer.C:
				if !snapshotDone {
					e.t.Fatalf("rule: a watch delivers its snapshot, then SnapshotDone; %s: no SnapshotDone within %v", ks, eventWait)
				}
				var missing []string
				for k, r := range want {
					if view[k] != r {
						missing = append(missing, fmt.Sprintf("%s@%d (saw %d)", k, r, view[k]))
					}
				}
				for k := range view {
					if _, ok := want[k]; !ok {
						missing = append(missing, k+" (deleted, delete never seen)")
					}
				}
				slices.Sort(missing)
				e.t.Fatalf("rule: a watch has no gaps, so the watcher's view converges to the store's; %s after %v it still differs on %d keys: %v",
					ks, eventWait, len(missing), missing[:min(len(missing), 8)])
			}
		}
		// The last phase was written only after SnapshotDone: every one of
		// its events has to arrive live (a create and delete of one key can
		// still be on their way when the view already matches). A rule that
		// saw fewer exercised nothing on the live side.
		timer.Reset(eventWait)
		for live < lastPhaseEvents {
			select {
			case ev, ok := <-ch:
				if !ok {
					e.t.Fatalf("watch closed")
				}
				if ev.Kind == spate.WatchPut || ev.Kind == spate.WatchDelete {
					live++
				}
			case <-timer.C:
				e.t.Fatalf("rule: writes after the snapshot arrive as live events; %s: %d live events within %v, but %d writes came after SnapshotDone",
					ks, live, eventWait, lastPhaseEvents)
			}
		}
		timer.Stop()
	}
}

func testListLive(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		want := map[string]uint64{}
		for _, k := range []string{"ll.c", "ll.a", "ll.b", "ll.d"} {
			want[k] = mustCreate(e, s, ks, k, "v-"+k)
		}
		mustCreate(e, s, ks, "other.a", "v")
		o := mustUpdate(e, s, ks, "ll.a", "v-ll.a", want["ll.a"])
		want["ll.a"] = o.Revision
		mustDelete(e, s, ks, "ll.d", want["ll.d"])
		delete(want, "ll.d")
		list, err := s.List(e.ctx, ks, "ll.")
		if err != nil {
			e.t.Fatalf("list: %v", err)
		}
		got := map[string]uint64{}
		var keys []string
		for _, en := range list {
			got[en.Key] = en.Revision
			keys = append(keys, en.Key)
			if string(en.Value) != "v-"+en.Key {
				e.t.Errorf("rule: a listing carries each key's value; %q has %q", en.Key, en.Value)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || len(list) != len(want) {
			e.t.Errorf("rule: list returns exactly the live keys under the prefix at their revisions; %s got %v, want %v", ks, got, want)
		}
		if !slices.IsSorted(keys) {
			e.t.Errorf("rule: a listing is sorted by key; %s got %v", ks, keys)
		}
	}
}

// testListNeverUnderReports lists while other keys churn and requires every
// key that was live throughout to be in every listing.
func testListNeverUnderReports(e *env) {
	s := e.open()
	churner := e.open()
	const stable = 40
	for _, ks := range keyspaces {
		revs := make([]uint64, stable)
		for i := range stable {
			revs[i] = mustCreate(e, s, ks, fmt.Sprintf("lu.stable.%02d", i), "v")
		}
		ctx, cancel := context.WithCancel(e.ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("lu.churn.%d", i%7)
				if o, err := churner.Create(ctx, ks, k, []byte("x")); err == nil && o.Won {
					_, _ = churner.Delete(ctx, ks, k, o.Revision)
				}
				j := i % stable
				if o, err := churner.Update(ctx, ks, fmt.Sprintf("lu.stable.%02d", j), []byte("y"), revs[j]); err == nil && o.Won {
					revs[j] = o.Revision
				}
				time.Sleep(time.Millisecond)
			}
		})
		for round := range 15 {
			list, err := s.List(e.ctx, ks, "lu.")
			if err != nil {
				cancel()
				wg.Wait()
				e.t.Fatalf("list: %v", err)
			}
			have := map[string]bool{}
			for _, en := range list {
				have[en.Key] = true
			}
			for i := range stable {
				if k := fmt.Sprintf("lu.stable.%02d", i); !have[k] {
					cancel()
					wg.Wait()
					e.t.Fatalf("rule: a listing never under-reports a key live for the whole call; %s listing %d misses %q (%d entries)",
						ks, round, k, len(list))
				}
			}
		}
		cancel()
		wg.Wait()
	}
}

func testConcurrentCAS(e *env) {
	const clients, increments = 4, 20
	stores := make([]spate.Store, clients)
	for i := range stores {
		stores[i] = e.open()
	}
	rec := &History{}
	if o, err := RecordCreate(e.ctx, rec, 0, stores[0], spate.Durable, "ctr", []byte("0")); err != nil || !o.Won {
		e.t.Fatalf("create counter: won=%t err=%v", o.Won, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			s := stores[c]
			for done, tries := 0, 0; done < increments; tries++ {
				if tries == 50*increments {
					errs <- fmt.Errorf("rule: compare-and-swap at the revision just read makes progress; client %d won %d of %d increments in %d tries",
						c, done, increments, tries)
					return
				}
				en, ok, err := RecordGet(e.ctx, rec, c, s, spate.Durable, "ctr")
				if err != nil || !ok {
					errs <- fmt.Errorf("client %d get: ok=%t err=%v", c, ok, err)
					return
				}
				v, _ := strconv.Atoi(string(en.Value))
				// Let the other clients interleave between read and write.
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				o, err := RecordUpdate(e.ctx, rec, c, s, spate.Durable, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
				if err != nil {
					errs <- fmt.Errorf("client %d update: %v", c, err)
					return
				}
				if o.Won {
					done++
					mu.Lock()
					won++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("unexpected error: %v", err)
	}
	en, _ := mustGet(e, stores[0], spate.Durable, "ctr")
	if got, _ := strconv.Atoi(string(en.Value)); got != won {
		e.t.Errorf("rule: concurrent compare-and-swap increments lose no update; counter reads %d after %d won increments", got, won)
	}
	e.after = append(e.after, func(t testing.TB) { // outside the bubble: a real-time timeout
		if ok, info := rec.Check(30 * time.Second); !ok {
			t.Errorf("rule: create and update are linearizable compare-and-swap operations; porcupine found no linearization of %d operations: %s",
				rec.Len(), info)
		}
	})
}

func testCancelledContext(e *env) {
	s := e.open()
	mustCreate(e, s, spate.Durable, "cc.k", "v")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	check := func(op string, err error) {
		e.t.Helper()
		if err == nil {
			e.t.Errorf("rule: an operation under a cancelled context fails; %s succeeded", op)
			return
		}
		if !errors.Is(err, spate.ErrRetryable) || spate.KindOf(err) != spate.KindRetryable {
			e.t.Errorf("rule: a cancelled context is classified Retryable; %s returned %v (kind %v)", op, err, spate.KindOf(err))
		}
	}
	_, err := s.Create(ctx, spate.Durable, "cc.new", []byte("v"))
	check("create", err)
	_, err = s.Update(ctx, spate.Durable, "cc.k", []byte("w"), 1)
	check("update", err)
	_, _, err = s.Get(ctx, spate.Durable, "cc.k")
	check("get", err)
	_, err = s.Delete(ctx, spate.Durable, "cc.k", spate.AnyRevision)
	check("delete", err)
	_, err = s.List(ctx, spate.Durable, "cc.")
	check("list", err)
	_, err = s.Watch(ctx, spate.Durable, "cc.")
	check("watch", err)
}

// testCancelledWatch: a live watch (its snapshot read, a live event seen)
// ends when its context is cancelled: its channel closes within eventWait,
// and whatever it still delivers before closing is no event of a write
// made after the cancellation.
func testCancelledWatch(e *env) {
	s := e.open()
	writer := e.open()
	for _, ks := range keyspaces {
		ctx, cancel := context.WithCancel(e.ctx)
		ch, err := s.Watch(ctx, ks, "cw.")
		if err != nil {
			cancel()
			e.t.Fatalf("watch: %v", err)
		}
		readSnapshot(e, ch)
		mustCreate(e, writer, ks, "cw.before", "v")
		if ev := expectEvent(e, ch, "cw.before", eventWait); ev.Kind != spate.WatchPut {
			cancel()
			e.t.Fatalf("rule: a create reaches a live watch as a put; got %v", ev.Kind)
		}
		cancel()
		mustCreate(e, writer, ks, "cw.after", "v")
		timer := time.NewTimer(eventWait)
	drain:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break drain
				}
				if ev.Key == "cw.after" {
					// Tolerated only while the stream winds down; it must
					// still close.
					continue
				}
			case <-timer.C:
				e.t.Fatalf("rule: cancelling a watch's context ends the stream and closes its channel; %s: still open %v after the cancellation", ks, eventWait)
			}
		}
		timer.Stop()
	}
}

func testValueCap(e *env) {
	s := e.open()
	limit := s.Capabilities().MaxValueSize
	if limit == 0 {
		big := bytes.Repeat([]byte{0xab}, 1<<20)
		mustCreateBytes(e, s, "cap.big", big)
		en, ok := mustGet(e, s, spate.Durable, "cap.big")
		if !ok || !bytes.Equal(en.Value, big) {
			e.t.Errorf("rule: a store that reports no value cap holds a 1 MiB value; it read back %d bytes (present %t)", len(en.Value), ok)
		}
		return
	}
	atCap := bytes.Repeat([]byte{'x'}, limit)
	mustCreateBytes(e, s, "cap.at", atCap)
	if en, ok := mustGet(e, s, spate.Durable, "cap.at"); !ok || !bytes.Equal(en.Value, atCap) {
		e.t.Errorf("rule: a value of exactly the reported cap (%d bytes) is accepted and round-trips", limit)
	}
	over := bytes.Repeat([]byte{'x'}, limit+1)
	_, err := s.Create(e.ctx, spate.Durable, "cap.over", over)
	if !errors.Is(err, spate.ErrValueTooLarge) || !errors.Is(err, spate.ErrFatal) {
		e.t.Errorf("rule: a value over the reported cap (%d bytes) is rejected with ErrValueTooLarge and ErrFatal; create returned %v", limit, err)
	}
	if _, ok := mustGet(e, s, spate.Durable, "cap.over"); ok {
		e.t.Errorf("rule: a rejected oversized value writes nothing; %q exists", "cap.over")
	}
	en, _ := mustGet(e, s, spate.Durable, "cap.at")
	_, err = s.Update(e.ctx, spate.Durable, "cap.at", over, en.Revision)
	if !errors.Is(err, spate.ErrValueTooLarge) {
		e.t.Errorf("rule: an update over the cap is rejected with ErrValueTooLarge; got %v", err)
	}
	if after, _ := mustGet(e, s, spate.Durable, "cap.at"); after.Revision != en.Revision {
		e.t.Errorf("rule: a rejected oversized update writes nothing; revision moved %d -> %d", en.Revision, after.Revision)
	}
}

func mustCreateBytes(e *env, s spate.Store, key string, v []byte) {
	e.t.Helper()
	o, err := s.Create(e.ctx, spate.Durable, key, v)
	if err != nil || !o.Won {
		e.t.Fatalf("create %q of %d bytes: won=%t err=%v", key, len(v), o.Won, err)
	}
}

func testInvalidKeys(e *env) {
	s := e.open()
	bad := []string{"", ".a", "a.", "a..b", "a b", "a/b", "a*", "a>", "é", strings.Repeat("k", spate.KeyMaxLen+1)}
	for _, k := range bad {
		_, err := s.Create(e.ctx, spate.Durable, k, []byte("v"))
		if !errors.Is(err, spate.ErrInvalidKey) || !errors.Is(err, spate.ErrFatal) {
			e.t.Errorf("rule: an invalid key is rejected with ErrInvalidKey and ErrFatal; create %q returned %v", k, err)
		}
	}
	if _, err := s.List(e.ctx, spate.Durable, "a b"); !errors.Is(err, spate.ErrInvalidKey) {
		e.t.Errorf("rule: an invalid prefix is rejected with ErrInvalidKey; list %q returned %v", "a b", err)
	}
	list, err := s.List(e.ctx, spate.Durable, "")
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	if len(list) != 0 {
		e.t.Errorf("rule: a rejected key writes nothing; the keyspace holds %d keys (first %q)", len(list), list[0].Key)
	}
	mustCreate(e, s, spate.Durable, strings.Repeat("k", spate.KeyMaxLen), "v")
}

func testValuesRoundTrip(e *env) {
	s := e.open()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	values := map[string][]byte{"rt.empty": {}, "rt.bytes": all, "rt.big": bytes.Repeat(all, 16)}
	ch := mustWatch(e, s, spate.Durable, "rt.")
	readSnapshot(e, ch)
	for _, k := range []string{"rt.empty", "rt.bytes", "rt.big"} {
		mustCreateBytes(e, s, k, values[k])
		ev := expectEvent(e, ch, k, eventWait)
		if !bytes.Equal(ev.Value, values[k]) {
			e.t.Errorf("rule: values round-trip byte for byte through watch; %q delivered %d bytes, want %d", k, len(ev.Value), len(values[k]))
		}
		en, _ := mustGet(e, s, spate.Durable, k)
		if !bytes.Equal(en.Value, values[k]) {
			e.t.Errorf("rule: values round-trip byte for byte through get; %q read %d bytes, want %d", k, len(en.Value), len(values[k]))
		}
	}
	list, err := s.List(e.ctx, spate.Durable, "rt.")
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	for _, en := range list {
		if !bytes.Equal(en.Value, values[en.Key]) {
			e.t.Errorf("rule: values round-trip byte for byte through list; %q listed %d bytes", en.Key, len(en.Value))
		}
	}
}

func testKeyspacesIndependent(e *env) {
	s := e.open()
	rd := mustCreate(e, s, spate.Durable, "ks.k", "durable")
	mustCreate(e, s, spate.Ephemeral, "ks.k", "ephemeral")
	d, _ := mustGet(e, s, spate.Durable, "ks.k")
	p, _ := mustGet(e, s, spate.Ephemeral, "ks.k")
	if string(d.Value) != "durable" || string(p.Value) != "ephemeral" {
		e.t.Fatalf("rule: the two keyspaces are independent; one key reads %q (durable) and %q (ephemeral)", d.Value, p.Value)
	}
	mustDelete(e, s, spate.Durable, "ks.k", rd)
	if _, ok := mustGet(e, s, spate.Ephemeral, "ks.k"); !ok {
		e.t.Errorf("rule: the two keyspaces are independent; deleting the durable key removed the ephemeral one")
	}
}

func testClientsShare(e *env) {
	a, b := e.open(), e.open()
	ch := mustWatch(e, b, spate.Durable, "share.")
	readSnapshot(e, ch)
	r := mustCreate(e, a, spate.Durable, "share.k", "from-a")
	en, ok := mustGet(e, b, spate.Durable, "share.k")
	if !ok || en.Revision != r || string(en.Value) != "from-a" {
		e.t.Fatalf("rule: stores of one namespace share state; b reads %q@%d (present %t), want %q@%d", en.Value, en.Revision, ok, "from-a", r)
	}
	ev := expectEvent(e, ch, "share.k", eventWait)
	if ev.Kind != spate.WatchPut || ev.Revision != r {
		e.t.Errorf("rule: one client's writes reach another's watch; got %v@%d", ev.Kind, ev.Revision)
	}
}

func testUseAfterClose(e *env) {
	other := e.open()
	s, err := e.h.NewStore(e.ctx)
	if err != nil {
		e.t.Fatalf("harness: open store: %v", err)
	}
	mustCreate(e, s, spate.Durable, "uac.k", "v")
	ch := mustWatch(e, s, spate.Durable, "uac.")
	readSnapshot(e, ch)
	if err := s.Close(); err != nil {
		e.t.Fatalf("close: %v", err)
	}
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
drain:
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				break drain
			}
		case <-timer.C:
			e.t.Fatalf("rule: Close ends every open watch; the channel is still open after %v", eventWait)
		}
	}
	check := func(op string, err error) {
		e.t.Helper()
		if !errors.Is(err, spate.ErrClosed) || !errors.Is(err, spate.ErrFatal) {
			e.t.Errorf("rule: after Close every call fails with ErrClosed and ErrFatal; %s returned %v", op, err)
		}
	}
	_, err = s.Create(e.ctx, spate.Durable, "uac.new", []byte("v"))
	check("create", err)
	_, err = s.Update(e.ctx, spate.Durable, "uac.k", []byte("v"), 1)
	check("update", err)
	_, _, err = s.Get(e.ctx, spate.Durable, "uac.k")
	check("get", err)
	_, err = s.Delete(e.ctx, spate.Durable, "uac.k", spate.AnyRevision)
	check("delete", err)
	_, err = s.List(e.ctx, spate.Durable, "uac.")
	check("list", err)
	_, err = s.Watch(e.ctx, spate.Durable, "uac.")
	check("watch", err)
	if err := s.Close(); err != nil {
		e.t.Errorf("rule: Close is idempotent; a second Close returned %v", err)
	}
	if _, ok := mustGet(e, other, spate.Durable, "uac.k"); !ok {
		e.t.Errorf("rule: closing one client leaves the data to others; %q is gone", "uac.k")
	}
	if _, err := other.Create(e.ctx, spate.Durable, "uac.other", []byte("v")); err != nil {
		e.t.Errorf("rule: closing one client leaves others working; create returned %v", err)
	}
}
