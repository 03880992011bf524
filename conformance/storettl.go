package conformance

import (
	"strconv"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// The rules of ephemeral keys: when they expire, and what sees it.

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

// testEphemeralLivesItsTTL: a key is there, to Get and List, 0.8 TTL after
// the start of the create that wrote it, and 0.8 TTL after the start of an
// update: the deadline is never earlier than a TTL from the start of the
// write call (a lease granted at open, a TTL rounded down or counted from
// an earlier write all break it).
func testEphemeralLivesItsTTL(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	check := func(what string, start time.Time, rev uint64) {
		e.t.Helper()
		time.Sleep(time.Until(start.Add(ttl * 8 / 10)))
		en, ok := mustGet(e, s, spate.Ephemeral, "life.k")
		require.True(e.t, ok, "rule: an ephemeral key lives a whole TTL from the start of its last write; %q is gone %v after the start of its %s (TTL %v)",
			"life.k", time.Since(start).Round(time.Millisecond), what, ttl)
		require.Equal(e.t, rev, en.Revision, "rule: an ephemeral key lives a whole TTL; %q changed under the test", "life.k")
		list, err := s.List(e.ctx, spate.Ephemeral, "life.")
		require.NoError(e.t, err, "list")
		require.Len(e.t, list, 1, "rule: an ephemeral key lives a whole TTL for every primitive; the listing %v after the start of its %s misses %q",
			time.Since(start).Round(time.Millisecond), what, "life.k")
	}
	start := time.Now()
	rev := mustCreate(e, s, spate.Ephemeral, "life.k", "v0")
	check("create", start, rev)
	start = time.Now()
	o := mustUpdate(e, s, spate.Ephemeral, "life.k", "v1", rev)
	require.True(e.t, o.Won, "update of a live key at its revision lost")
	check("update", start, o.Revision)
}

// testExpiryOneInstant polls an untouched ephemeral key with Get from 0.9
// TTL on; at the first Get that finds it gone, every other primitive must
// find it gone too: an Update and a guarded Delete at its revision lose, a
// listing misses it, a Create wins with a larger revision. A driver that
// expires keys in one read path only (a client-side deadline check in Get,
// a lazy sweep other scripts skip) breaks it.
func testExpiryOneInstant(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	start := time.Now()
	rev := mustCreate(e, s, spate.Ephemeral, "inst.k", "v")
	deadline := start.Add(expiryBound(s))
	time.Sleep(time.Until(start.Add(ttl * 9 / 10)))
	polls := 0
	for {
		_, ok := mustGet(e, s, spate.Ephemeral, "inst.k")
		polls++
		if !ok {
			break
		}
		require.False(e.t, time.Now().After(deadline), "rule: an untouched ephemeral key expires; %q still reads present %v after its create (TTL %v)",
			"inst.k", time.Since(start).Round(time.Millisecond), ttl)
		time.Sleep(ttl / 50)
	}
	gone := time.Since(start).Round(time.Millisecond)
	o := mustUpdate(e, s, spate.Ephemeral, "inst.k", "zombie", rev)
	assert.False(e.t, o.Won, "rule: a key expires at one instant for every primitive; Get found %q gone %v after its create, then an Update at its revision won",
		"inst.k", gone)
	d := mustDelete(e, s, spate.Ephemeral, "inst.k", rev)
	assert.False(e.t, d.Won, "rule: a key expires at one instant for every primitive; Get found %q gone, then a guarded Delete at its revision won", "inst.k")
	list, err := s.List(e.ctx, spate.Ephemeral, "inst.")
	require.NoError(e.t, err, "list")
	assert.Empty(e.t, list, "rule: a key expires at one instant for every primitive; Get found %q gone, then a listing showed it", "inst.k")
	c, err := s.Create(e.ctx, spate.Ephemeral, "inst.k", []byte("again"))
	require.NoError(e.t, err, "re-create")
	assert.True(e.t, c.Won, "rule: a key expires at one instant for every primitive; Get found %q gone, then a Create lost", "inst.k")
	e.t.Logf("expired %v after the create (TTL %v), found by poll %d", gone, ttl, polls)
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
	ev := recvTimeout(e.t, ch, bound+eventWait/2, "an expiry as a delete (of ew.k)")
	if ev.Kind != spate.WatchDelete || ev.Key != "ew.k" {
		e.t.Fatalf("rule: an untouched ephemeral key's expiry reaches watchers as a delete; got %v %q", ev.Kind, ev.Key)
	}
	if ev.Revision <= r {
		e.t.Errorf("rule: an expiry delete carries a revision above the key's last put; %d <= %d", ev.Revision, r)
	}
}

// testExpiryLatency: the delete of an untouched ephemeral key reaches a
// watcher no earlier than a TTL after the start of its create, and no
// later than ExpiryLatency after its deadline (plus scheduling slack, see
// expiryBound).
func testExpiryLatency(e *env) {
	s := e.open()
	ttl := ttlOf(e, s)
	ch := mustWatch(e, s, spate.Ephemeral, "lat.")
	readSnapshot(e, ch)
	start := time.Now()
	r := mustCreate(e, s, spate.Ephemeral, "lat.k", "v")
	put := expectEvent(e, ch, "lat.k", eventWait)
	require.Equal(e.t, spate.WatchPut, put.Kind, "rule: a create reaches watchers as a put")
	bound := expiryBound(s)
	ev := recvTimeout(e.t, ch, time.Until(start.Add(bound)), "an expiry within ExpiryLatency of its deadline (of lat.k)")
	at := time.Since(start)
	require.Equal(e.t, spate.WatchDelete, ev.Kind, "rule: an expiry reaches watchers as a delete; got %v %q", ev.Kind, ev.Key)
	require.Equal(e.t, "lat.k", ev.Key)
	assert.Greater(e.t, ev.Revision, r, "rule: an expiry delete carries a revision above the key's last put")
	assert.GreaterOrEqual(e.t, at, ttl, "rule: a key expires no earlier than its deadline; its delete reached the watcher %v after the create (TTL %v)",
		at.Round(time.Millisecond), ttl)
	e.t.Logf("the expiry reached the watcher %v after the create (TTL %v, expiry latency %v)",
		at.Round(time.Millisecond), ttl, s.Capabilities().ExpiryLatency)
}
