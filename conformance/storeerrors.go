package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// The rules of what a store reports about itself, of arguments and error
// classes, and of Close.

func testDriverNamed(e *env) {
	a, b := e.open(), e.open()
	d := a.Capabilities().Driver
	require.NotEmpty(e.t, d, "rule: a store names its driver; Capabilities.Driver is empty")
	assert.Equal(e.t, d, b.Capabilities().Driver, "rule: a store names its driver; two clients of one harness name different ones")
}

// testRequiredSettingsMet: a store whose driver found a required server
// setting unmet (or could not verify it) when it was opened fails, naming
// each setting. A harness that knowingly runs on a scratch server (no
// persistence) skips this rule by name.
func testRequiredSettingsMet(e *env) {
	unmet := e.open().Capabilities().UnmetSettings
	assert.Empty(e.t, unmet, "rule: every required server setting is met; the driver reports unmet: %v", unmet)
}

// testTTLFixed: the TTL is positive, the same for every client of one
// harness, and does not move: not a quarter TTL later, not after writes,
// not after Close (a driver reporting its lease's time left breaks it).
func testTTLFixed(e *env) {
	a := e.open()
	ttl := ttlOf(e, a)
	assert.Equal(e.t, ttl, e.open().Capabilities().TTL, "rule: the TTL is fixed when the store is opened; two clients of one harness report different TTLs")
	mustCreate(e, a, spate.Ephemeral, "ttl.k", "v")
	time.Sleep(ttl / 4)
	assert.Equal(e.t, ttl, a.Capabilities().TTL, "rule: the TTL is fixed when the store is opened; it moved a quarter TTL and a write later")
	require.NoError(e.t, a.Close(), "close")
	assert.Equal(e.t, ttl, a.Capabilities().TTL, "rule: the TTL is fixed when the store is opened; it moved at Close")
}

// testTTLFloor: the smallest TTL the backend supports is positive and no
// larger than the TTL the store runs with.
func testTTLFloor(e *env) {
	c := e.open().Capabilities()
	assert.Positive(e.t, c.TTLFloor, "rule: a store reports the smallest TTL its backend supports; TTLFloor is %v", c.TTLFloor)
	assert.LessOrEqual(e.t, c.TTLFloor, c.TTL, "rule: the smallest TTL the backend supports is at most the TTL it runs with; floor %v, TTL %v", c.TTLFloor, c.TTL)
}

// testCapabilitiesNeverBlock: Capabilities answers from the client (on an
// idle client, while a watch is open, after Close); a driver that asks its
// server each time breaks it. Judged against the store's own round trip,
// not a fixed time: in each phase the fastest of capBatches batches of
// capCalls calls must take less than 10 round trips of a Get (the fastest
// of capBatches) or capFloor, whichever is longer. A driver that asks its
// server spends capCalls round trips on every batch (the mutant that
// sleeps 5 ms a call, 500 ms); a loaded machine slows some batches of a
// correct driver, not all of them.
func testCapabilitiesNeverBlock(e *env) {
	// capRounds: a phase over the limit is measured again, up to this
	// many rounds of capBatches in all: a loaded machine (cmd/spate's
	// tests beside the store, load 6) slowed every batch of one round of
	// a healthy Redis store past the limit (12.5 ms), while a call that
	// asks the server is slower in every round.
	const capBatches, capCalls, capRounds, capFloor = 5, 100, 3, 10 * time.Millisecond
	s := e.open()
	rtt := time.Duration(math.MaxInt64)
	for range capBatches {
		at := time.Now()
		mustGet(e, s, spate.Durable, "nb.rtt")
		rtt = min(rtt, time.Since(at))
	}
	limit := max(10*rtt, capFloor)
	phases := []string{"idle", "with a watch open", "after Close"}
	fastest := func(phase string) time.Duration {
		best := time.Duration(math.MaxInt64)
		rounds := 0
		for ; rounds < capRounds && best >= limit; rounds++ {
			for range capBatches {
				at := time.Now()
				for range capCalls {
					s.Capabilities()
				}
				best = min(best, time.Since(at))
			}
		}
		if rounds > 1 {
			e.t.Logf("Capabilities %s: a round of batches was over the limit (%v), measured again: %d rounds, fastest batch %v",
				phase, limit, rounds, best)
		}
		return best
	}
	took := []time.Duration{fastest(phases[0])}
	readSnapshot(e, mustWatch(e, s, spate.Durable, "nb."))
	took = append(took, fastest(phases[1]))
	require.NoError(e.t, s.Close(), "close")
	took = append(took, fastest(phases[2]))
	for i, d := range took {
		require.Less(e.t, d, limit, "rule: Capabilities never blocks; %s, the fastest of up to %d batches of %d calls took %v, not under 10 round trips of a Get (fastest %v) or %v",
			phases[i], capRounds*capBatches, capCalls, d, rtt, capFloor)
	}
}

// testValueCapReported: a value of exactly the reported cap (1 MiB when the
// store reports none) is accepted by Create and Update in both keyspaces
// and reads back whole.
func testValueCapReported(e *env) {
	s := e.open()
	limit := s.Capabilities().MaxValueSize
	require.GreaterOrEqual(e.t, limit, 0, "rule: MaxValueSize is a size in bytes or 0; got %d", limit)
	size := limit
	if limit == 0 {
		size = 1 << 20
	}
	for _, ks := range keyspaces {
		e.withinATTL(s, ks, func(attempt int) string {
			key := fmt.Sprintf("cap.at%d", attempt)
			v := bytes.Repeat([]byte{'c'}, size)
			o, err := s.Create(e.ctx, ks, key, v)
			if err != nil {
				return fmt.Sprintf("rule: the store accepts values up to its reported cap (%d, 0 = none); a %s create of %d bytes failed: %v", limit, ks, size, err)
			}
			if !o.Won {
				return fmt.Sprintf("create of an absent key lost (%s %q)", ks, key)
			}
			en, ok := mustGet(e, s, ks, key)
			if !ok || !bytes.Equal(en.Value, v) {
				return fmt.Sprintf("rule: a value of the cap's size reads back whole; %s read %d bytes (present %t)", ks, len(en.Value), ok)
			}
			v = bytes.Repeat([]byte{'u'}, size)
			o, err = s.Update(e.ctx, ks, key, v, o.Revision)
			if err != nil {
				return fmt.Sprintf("rule: the store accepts values up to its reported cap (%d, 0 = none); a %s update of %d bytes failed: %v", limit, ks, size, err)
			}
			if !o.Won {
				return fmt.Sprintf("update at the current revision lost (%s %q)", ks, key)
			}
			en, ok = mustGet(e, s, ks, key)
			if !ok || !bytes.Equal(en.Value, v) {
				return fmt.Sprintf("rule: a value of the cap's size reads back whole; %s read %d bytes after the update (present %t)", ks, len(en.Value), ok)
			}
			return ""
		})
	}
}

// testOversizedRejected: a value one byte over the reported cap is
// rejected by Create and Update in both keyspaces with ErrValueTooLarge
// and ErrFatal, and nothing is written. A store that reports no cap has
// nothing to reject: the rule is skipped, visibly.
func testOversizedRejected(e *env) {
	s := e.open()
	limit := s.Capabilities().MaxValueSize
	if limit == 0 {
		e.t.Skip("the store reports no value cap: no value is over it")
	}
	over := bytes.Repeat([]byte{'o'}, limit+1)
	check := func(op string, ks spate.Keyspace, err error) {
		e.t.Helper()
		require.Error(e.t, err, "rule: a value over the reported cap (%d bytes) is rejected; a %s %s of %d bytes succeeded", limit, ks, op, limit+1)
		assert.ErrorIs(e.t, err, spate.ErrValueTooLarge, "rule: an oversized value fails with ErrValueTooLarge; %s %s", ks, op)
		assert.ErrorIs(e.t, err, spate.ErrFatal, "rule: an oversized value fails Fatal; %s %s", ks, op)
		assert.NotErrorIs(e.t, err, spate.ErrRetryable, "rule: an oversized value fails Fatal, never Retryable; %s %s", ks, op)
	}
	for _, ks := range keyspaces {
		_, err := s.Create(e.ctx, ks, "big.new", over)
		check("create", ks, err)
		_, ok := mustGet(e, s, ks, "big.new")
		assert.False(e.t, ok, "rule: a rejected oversized create writes nothing; %s %q exists", ks, "big.new")
		r := mustCreate(e, s, ks, "big.k", "small")
		_, err = s.Update(e.ctx, ks, "big.k", over, r)
		check("update", ks, err)
		en, _ := mustGet(e, s, ks, "big.k")
		assert.Equal(e.t, r, en.Revision, "rule: a rejected oversized update writes nothing; %s revision moved", ks)
		assert.Equal(e.t, "small", string(en.Value), "rule: a rejected oversized update writes nothing; %s value changed", ks)
	}
}

// testValidKeys: keys of every shape the syntax allows (one byte, 256
// bytes, every allowed byte, inner dots, keys that differ only in case or
// in '-' against '_') are distinct keys that every primitive accepts.
func testValidKeys(e *env) {
	s := e.open()
	keys := []string{
		"a", "Z", "0", "-", "_", "-.-", "_._",
		"vk.ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
		"vk.AB", "vk.ab", "vk.Ab", "vk.a-b", "vk.a_b", "vk.a.b.c",
		strings.Repeat("k", spate.KeyMaxLen),
		"vk." + strings.Repeat("x", spate.KeyMaxLen-3),
	}
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "")
		readSnapshot(e, ch)
		revs := map[string]uint64{}
		for _, k := range keys {
			o, err := s.Create(e.ctx, ks, k, []byte("v:"+k))
			require.NoError(e.t, err, "rule: every key of the syntax is accepted; %s create of %q (%d bytes)", ks, k, len(k))
			require.True(e.t, o.Won, "rule: keys that differ are different keys; %s create of %q lost (is it folded into another key?)", ks, k)
			revs[k] = o.Revision
		}
		for _, k := range keys {
			en, ok := mustGet(e, s, ks, k)
			require.True(e.t, ok, "rule: every key of the syntax is a key; %s %q reads absent", ks, k)
			assert.Equal(e.t, "v:"+k, string(en.Value), "rule: keys that differ are different keys; %s %q reads another key's value", ks, k)
			ev := expectEvent(e, ch, k, eventWait)
			assert.Equal(e.t, revs[k], ev.Revision, "%s %q: the put event's revision", ks, k)
		}
		listed := listMap(e, s, ks, "")
		assert.Equal(e.t, revs, listed, "rule: every key of the syntax is listed as itself; %s", ks)
		for _, k := range keys {
			// rewrite: on a loaded machine with a short TTL an ephemeral
			// key may have expired since its create; that is no failure
			// of its syntax.
			o, err := rewrite(e.ctx, s, ks, k, []byte("w"), revs[k])
			require.NoError(e.t, err, "rule: every key of the syntax is accepted; %s update of %q", ks, k)
			assert.True(e.t, o.Won, "rule: every key of the syntax is accepted; %s update of %q lost", ks, k)
			d := mustDelete(e, s, ks, k, o.Revision)
			if !d.Won && o.Won && ks == spate.Ephemeral {
				// The same for the delete: the key may have expired
				// since its update. If it reads absent, it is created
				// and deleted again, once; a second loss fails.
				if _, live := mustGet(e, s, ks, k); !live {
					e.t.Logf("ephemeral %q read absent after its delete lost (expired since its update?); created and deleted again", k)
					d = mustDelete(e, s, ks, k, mustCreate(e, s, ks, k, "w"))
				}
			}
			assert.True(e.t, d.Won, "rule: every key of the syntax is accepted; %s delete of %q lost", ks, k)
		}
	}
}

// testValidPrefixes: List and Watch take the empty prefix, a prefix ending
// in '.', one ending mid-segment and a whole key, and return exactly the
// keys that start with it, byte for byte.
func testValidPrefixes(e *env) {
	s := e.open()
	keys := []string{"vp.a", "vp.ab", "vp.ab.c", "vp.abc", "vp.b", "vq"}
	prefixes := []string{"", "v", "vp", "vp.", "vp.a", "vp.ab", "vp.ab.", "vp.ab.c", "vz"}
	for _, ks := range keyspaces {
		revs := map[string]uint64{}
		for _, k := range keys {
			revs[k] = mustCreate(e, s, ks, k, "v")
		}
		for _, p := range prefixes {
			if ks == spate.Ephemeral {
				// Each prefix is checked within a fresh TTL: on a loaded
				// machine with a short TTL the whole loop can outlast it.
				for _, k := range keys {
					revs[k] = refresh(e, s, k, revs[k])
				}
			}
			var want []string
			for _, k := range keys {
				if strings.HasPrefix(k, p) {
					want = append(want, k)
				}
			}
			list, err := s.List(e.ctx, ks, p)
			require.NoError(e.t, err, "rule: a prefix is empty or a key prefix that may end with '.'; %s list %q", ks, p)
			var listed []string
			for _, en := range list {
				listed = append(listed, en.Key)
			}
			// One watch at a time: each holds a connection of the client
			// (Redis reads its change log with a blocking XREAD), and
			// eighteen at once starved a pool-sized client on a cluster.
			wctx, cancel := context.WithCancel(e.ctx)
			ch, err := boundedWatch(e, s, wctx, ks, p)
			require.NoError(e.t, err, "rule: a prefix is empty or a key prefix that may end with '.'; %s watch %q", ks, p)
			var snap []string
			for _, ev := range readSnapshot(e, ch) {
				snap = append(snap, ev.Key)
			}
			cancel()
			slices.Sort(snap)
			mustHold := want
			if ks == spate.Ephemeral {
				// On a loaded machine a key can expire before the watch
				// is made: the listing and the snapshot must hold exactly
				// the keys of the prefix that were live throughout (still
				// at the revision written before the listing), and may
				// hold those that expired meanwhile.
				mustHold = nil
				for _, k := range want {
					if en, ok := mustGet(e, s, ks, k); ok && en.Revision == revs[k] {
						mustHold = append(mustHold, k)
					}
				}
			}
			for what, got := range map[string][]string{"a listing": listed, "a watch's snapshot": snap} {
				if ks == spate.Durable || slices.Equal(got, want) {
					assert.Equal(e.t, want, got, "rule: %s holds the keys that start with its prefix; %s prefix %q", what, ks, p)
					continue
				}
				assert.Subset(e.t, want, got, "rule: %s holds only keys that start with its prefix; %s prefix %q", what, ks, p)
				assert.Subset(e.t, got, mustHold, "rule: %s holds the keys that start with its prefix; %s prefix %q", what, ks, p)
			}
		}
	}
}

// refresh rewrites ephemeral key k, last written at rev, so that it lives
// a whole TTL from now, and returns its new revision (see rewrite); an
// update that lost while the key is live fails the test.
func refresh(e *env, s spate.Store, k string, rev uint64) uint64 {
	e.t.Helper()
	o, err := rewrite(e.ctx, s, spate.Ephemeral, k, []byte("v"), rev)
	require.NoError(e.t, err, "rewrite ephemeral %q", k)
	require.True(e.t, o.Won, "ephemeral %q: an update at its last revision %d lost while it is live", k, rev)
	require.NotZero(e.t, o.Revision, "rule: a live key's revision is never 0; ephemeral %q rewritten at 0", k)
	return o.Revision
}

// rewrite updates key k of ks, last written at rev, to value. On the
// ephemeral keyspace a key the rule rewrites every few calls may have
// expired meanwhile on a loaded machine with a short TTL: an update that
// loses finds it absent and creates it again. An update that loses while
// the key is live is returned as lost. It makes no test calls, so that a
// writer goroutine may use it.
func rewrite(ctx context.Context, s spate.Store, ks spate.Keyspace, k string, value []byte, rev uint64) (spate.Outcome, error) {
	o, err := s.Update(ctx, ks, k, value, rev)
	if err != nil || o.Won || ks != spate.Ephemeral {
		return o, err
	}
	if _, live, err := s.Get(ctx, ks, k); err != nil || live {
		return o, err
	}
	return s.Create(ctx, ks, k, value)
}

// badKeys and badPrefixes break the key syntax each in its own way.
var (
	badKeys     = []string{"", ".a", "a.", "a..b", "a b", "a/b", "a*", "a>", "é", "a\x00", strings.Repeat("k", spate.KeyMaxLen+1)}
	badPrefixes = []string{".a", "a..", "a..b", "a b", "a/b", "a*", ">", "é", strings.Repeat("k", spate.KeyMaxLen+1)}
)

// testInvalidKeys: every primitive rejects a key (Create, Update, Get,
// Delete) or prefix (List, Watch) outside the syntax with ErrInvalidKey and
// ErrFatal, and nothing is written.
func testInvalidKeys(e *env) {
	s := e.open()
	check := func(op string, ks spate.Keyspace, key string, err error) {
		e.t.Helper()
		require.Error(e.t, err, "rule: an invalid key or prefix is rejected; %s %s %q succeeded", ks, op, key)
		assert.ErrorIs(e.t, err, spate.ErrInvalidKey, "rule: an invalid key or prefix fails with ErrInvalidKey; %s %s %q", ks, op, key)
		assert.ErrorIs(e.t, err, spate.ErrFatal, "rule: an invalid key or prefix fails Fatal; %s %s %q", ks, op, key)
		assert.NotErrorIs(e.t, err, spate.ErrRetryable, "rule: an invalid key or prefix fails Fatal, never Retryable; %s %s %q", ks, op, key)
	}
	checked := 0
	for _, ks := range keyspaces {
		r := mustCreate(e, s, ks, "ik.k", "v")
		for _, k := range badKeys {
			_, err := s.Create(e.ctx, ks, k, []byte("v"))
			check("create", ks, k, err)
			_, err = s.Update(e.ctx, ks, k, []byte("v"), r)
			check("update", ks, k, err)
			_, _, err = s.Get(e.ctx, ks, k)
			check("get", ks, k, err)
			_, err = s.Delete(e.ctx, ks, k, spate.AnyRevision)
			check("unconditional delete", ks, k, err)
			_, err = s.Delete(e.ctx, ks, k, r)
			check("guarded delete", ks, k, err)
			checked += 5
		}
		for _, p := range badPrefixes {
			_, err := s.List(e.ctx, ks, p)
			check("list", ks, p, err)
			ch, err := boundedWatch(e, s, e.ctx, ks, p)
			check("watch", ks, p, err)
			assert.Nil(e.t, ch, "rule: a watch that cannot be established returns no channel; %s watch %q", ks, p)
			checked += 2
		}
		assert.Equal(e.t, map[string]uint64{"ik.k": r}, listMap(e, s, ks, ""), "rule: a rejected key writes nothing; %s", ks)
	}
	e.t.Logf("%d calls with invalid keys and prefixes, all rejected", checked)
}

// invalidKeyspaces are not keyspaces.
var invalidKeyspaces = []spate.Keyspace{0, 3, 255}

// allOps calls every primitive of s with ks, key (prefix for List and
// Watch) and ctx, and returns each one's error by name; a Watch that
// returns a channel has it drained in the background.
func allOps(ctx context.Context, s spate.Store, ks spate.Keyspace, key string, rev uint64) map[string]error {
	errs := map[string]error{}
	_, errs["create"] = s.Create(ctx, ks, key, []byte("v"))
	_, errs["update"] = s.Update(ctx, ks, key, []byte("v"), rev)
	_, _, errs["get"] = s.Get(ctx, ks, key)
	_, errs["delete"] = s.Delete(ctx, ks, key, rev)
	_, errs["list"] = s.List(ctx, ks, key)
	ch, err := s.Watch(ctx, ks, key)
	errs["watch"] = err
	if ch != nil { // a broken driver's: it ends with ctx or the store
		go func() {
			for range ch {
			}
		}()
	}
	return errs
}

// opNames orders allOps's results.
var opNames = []string{"create", "update", "get", "delete", "list", "watch"}

// testInvalidKeyspaces: every primitive rejects a keyspace other than
// Durable and Ephemeral with an error matching ErrFatal (not Retryable),
// and nothing is written to either keyspace.
func testInvalidKeyspaces(e *env) {
	s := e.open()
	for _, ks := range invalidKeyspaces {
		ctx, cancel := context.WithCancel(e.ctx)
		errs := allOps(ctx, s, ks, "iks.k", 1)
		for _, op := range opNames {
			err := errs[op]
			require.Error(e.t, err, "rule: a keyspace other than Durable and Ephemeral is Fatal; %s in %v succeeded", op, ks)
			assert.ErrorIs(e.t, err, spate.ErrFatal, "rule: a keyspace other than Durable and Ephemeral is Fatal; %s in %v", op, ks)
			assert.NotErrorIs(e.t, err, spate.ErrRetryable, "rule: a keyspace other than Durable and Ephemeral is Fatal, not Retryable; %s in %v", op, ks)
		}
		cancel()
	}
	for _, ks := range keyspaces {
		assert.Empty(e.t, listMap(e, s, ks, ""), "rule: a call in an invalid keyspace writes nothing; the %s keyspace holds keys", ks)
	}
}

// snapshotAll lists both keyspaces whole: key to value@revision.
func snapshotAll(e *env, s spate.Store) map[string]string {
	e.t.Helper()
	all := map[string]string{}
	for _, ks := range keyspaces {
		list, err := s.List(e.ctx, ks, "")
		require.NoError(e.t, err, "list %s", ks)
		for _, en := range list {
			all[ks.String()+"/"+en.Key] = fmt.Sprintf("%q@%d", en.Value, en.Revision)
		}
	}
	return all
}

// testFatalWritesWriteNothing: writes that fail Fatal (invalid keys, an
// invalid keyspace, oversized values, any write on a closed client) leave
// both keyspaces exactly as they were, as another client lists them.
func testFatalWritesWriteNothing(e *env) {
	s, other, closed := e.open(), e.open(), e.open()
	limit := s.Capabilities().MaxValueSize
	revs := map[spate.Keyspace]uint64{}
	for _, ks := range keyspaces {
		revs[ks] = mustCreate(e, s, ks, "fw.k", "v")
	}
	require.NoError(e.t, closed.Close(), "close")
	before := snapshotAll(e, other)
	attempted := 0
	fatal := func(what string, err error) {
		e.t.Helper()
		attempted++
		require.Error(e.t, err, "rule: a write that fails Fatal writes nothing; %s must fail Fatal, and succeeded", what)
		require.ErrorIs(e.t, err, spate.ErrFatal, "rule: a write that fails Fatal writes nothing; %s must fail Fatal, and returned %v", what, err)
	}
	for _, ks := range keyspaces {
		r := revs[ks]
		_, err := s.Create(e.ctx, ks, "fw..new", []byte("v"))
		fatal("create of an invalid key", err)
		_, err = s.Update(e.ctx, ks, "fw.k.", []byte("w"), r)
		fatal("update of an invalid key", err)
		_, err = s.Delete(e.ctx, ks, "fw..k", spate.AnyRevision)
		fatal("delete of an invalid key", err)
		_, err = closed.Create(e.ctx, ks, "fw.closed", []byte("v"))
		fatal("create on a closed client", err)
		_, err = closed.Update(e.ctx, ks, "fw.k", []byte("w"), r)
		fatal("update on a closed client", err)
		_, err = closed.Delete(e.ctx, ks, "fw.k", r)
		fatal("guarded delete on a closed client", err)
		_, err = closed.Delete(e.ctx, ks, "fw.k", spate.AnyRevision)
		fatal("delete on a closed client", err)
		if limit > 0 {
			over := bytes.Repeat([]byte{'o'}, limit+1)
			_, err = s.Create(e.ctx, ks, "fw.big", over)
			fatal("create of an oversized value", err)
			_, err = s.Update(e.ctx, ks, "fw.k", over, r)
			fatal("update to an oversized value", err)
		}
	}
	for _, ks := range invalidKeyspaces {
		_, err := s.Create(e.ctx, ks, "fw.new", []byte("v"))
		fatal("create in an invalid keyspace", err)
		_, err = s.Update(e.ctx, ks, "fw.k", []byte("w"), revs[spate.Durable])
		fatal("update in an invalid keyspace", err)
		_, err = s.Delete(e.ctx, ks, "fw.k", spate.AnyRevision)
		fatal("delete in an invalid keyspace", err)
	}
	assert.Equal(e.t, before, snapshotAll(e, other), "rule: a write that fails Fatal writes nothing; the keyspaces changed under %d Fatal writes", attempted)
	e.t.Logf("%d writes failed Fatal and wrote nothing", attempted)
}

// testErrorsClassified provokes every error a store must return without a
// fault (invalid keys, an invalid keyspace, cancelled and expired
// contexts, a closed client, oversized values) from every primitive, and
// requires each to match exactly one of ErrRetryable and ErrFatal (never
// ErrFenced, which no store returns).
func testErrorsClassified(e *env) {
	s, closed := e.open(), e.open()
	require.NoError(e.t, closed.Close(), "close")
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	cases := []struct {
		what string
		errs map[string]error
	}{
		{"an invalid key", allOps(e.ctx, s, spate.Durable, "ec..k", 1)},
		{"an invalid keyspace", allOps(e.ctx, s, spate.Keyspace(3), "ec.k", 1)},
		{"a cancelled context", allOps(cancelled, s, spate.Ephemeral, "ec.k", 1)},
		{"an expired context", allOps(expired, s, spate.Durable, "ec.k", 1)},
		{"a closed client", allOps(e.ctx, closed, spate.Ephemeral, "ec.k", 1)},
	}
	if limit := s.Capabilities().MaxValueSize; limit > 0 {
		over := bytes.Repeat([]byte{'o'}, limit+1)
		_, cerr := s.Create(e.ctx, spate.Durable, "ec.big", over)
		_, uerr := s.Update(e.ctx, spate.Durable, "ec.big", over, 1)
		cases = append(cases, struct {
			what string
			errs map[string]error
		}{"an oversized value", map[string]error{"create": cerr, "update": uerr}})
	}
	n := 0
	for _, c := range cases {
		for _, op := range opNames {
			err, ok := c.errs[op]
			if !ok {
				continue
			}
			n++
			require.Error(e.t, err, "%s with %s succeeded", op, c.what)
			r, f := errors.Is(err, spate.ErrRetryable), errors.Is(err, spate.ErrFatal)
			assert.True(e.t, r != f, "rule: every error matches exactly one of ErrRetryable and ErrFatal; %s with %s returned %v (retryable %t, fatal %t)",
				op, c.what, err, r, f)
			assert.NotErrorIs(e.t, err, spate.ErrFenced, "rule: a store never returns ErrFenced; %s with %s", op, c.what)
		}
	}
	e.t.Logf("%d errors, each in exactly one class", n)
}

// deadContexts are a cancelled context and one past its deadline, with
// the error each must keep.
func deadContexts(e *env) []struct {
	what  string
	ctx   context.Context
	cause error
} {
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	e.t.Cleanup(cancel2)
	return []struct {
		what  string
		ctx   context.Context
		cause error
	}{
		{"a cancelled context", cancelled, context.Canceled},
		{"an expired context", expired, context.DeadlineExceeded},
	}
}

// testDeadContextRetryable: every primitive fails Retryable under a
// cancelled context and under one past its deadline.
func testDeadContextRetryable(e *env) {
	s := e.open()
	r := mustCreate(e, s, spate.Durable, "dc.k", "v")
	for _, c := range deadContexts(e) {
		errs := allOps(c.ctx, s, spate.Durable, "dc.k", r)
		for _, op := range opNames {
			err := errs[op]
			require.Error(e.t, err, "rule: an operation under %s fails; %s succeeded", c.what, op)
			assert.ErrorIs(e.t, err, spate.ErrRetryable, "rule: %s is Retryable; %s returned %v", c.what, op, err)
			assert.True(e.t, spate.IsRetryable(err), "rule: %s is Retryable, not Fatal; %s returned %v", c.what, op, err)
		}
	}
}

// testContextCause: the error of a call under a dead context keeps the
// context's own error (context.Canceled, context.DeadlineExceeded) along
// with its class.
func testContextCause(e *env) {
	s := e.open()
	r := mustCreate(e, s, spate.Ephemeral, "cause.k", "v")
	for _, c := range deadContexts(e) {
		errs := allOps(c.ctx, s, spate.Ephemeral, "cause.k", r)
		for _, op := range opNames {
			require.Error(e.t, errs[op], "%s under %s succeeded", op, c.what)
			assert.ErrorIs(e.t, errs[op], c.cause, "rule: a driver keeps the backend's error and adds the class; %s under %s returned %v", op, c.what, errs[op])
		}
	}
}

// testLostIsOutcome: every lost condition (a create of a live key, an
// update at a stale, future or zero revision or of an absent key, a
// guarded delete at a wrong revision or of an absent key) returns Lost and
// a nil error.
func testLostIsOutcome(e *env) {
	s := e.open()
	lost := func(what string, o spate.Outcome, err error) {
		e.t.Helper()
		require.NoError(e.t, err, "rule: losing a condition is an outcome, not an error; %s", what)
		assert.False(e.t, o.Won, "%s won", what)
	}
	for _, ks := range keyspaces {
		r := mustCreate(e, s, ks, "lo.k", "v")
		o, err := s.Create(e.ctx, ks, "lo.k", []byte("again"))
		lost(ks.String()+" create of a live key", o, err)
		u := mustUpdate(e, s, ks, "lo.k", "w", r)
		require.True(e.t, u.Won, "update at the current revision lost")
		o, err = s.Update(e.ctx, ks, "lo.k", []byte("x"), r)
		lost(ks.String()+" update at a stale revision", o, err)
		o, err = s.Update(e.ctx, ks, "lo.k", []byte("x"), u.Revision+1000)
		lost(ks.String()+" update at a future revision", o, err)
		o, err = s.Update(e.ctx, ks, "lo.k", []byte("x"), 0)
		lost(ks.String()+" update at revision 0", o, err)
		o, err = s.Update(e.ctx, ks, "lo.absent", []byte("x"), u.Revision)
		lost(ks.String()+" update of an absent key", o, err)
		o, err = s.Delete(e.ctx, ks, "lo.k", r)
		lost(ks.String()+" guarded delete at a stale revision", o, err)
		o, err = s.Delete(e.ctx, ks, "lo.absent", u.Revision)
		lost(ks.String()+" guarded delete of an absent key", o, err)
	}
}

// testCloseEndsWatches: Close ends every watch the client has open (three,
// over both keyspaces) within eventWait, is idempotent, and leaves another
// client of the same store working, its data intact.
func testCloseEndsWatches(e *env) {
	s, other := e.open(), e.open()
	r := mustCreate(e, other, spate.Durable, "cl.k", "v")
	var chans []<-chan spate.WatchEvent
	for _, w := range []struct {
		ks  spate.Keyspace
		pre string
	}{{spate.Durable, ""}, {spate.Ephemeral, "cl."}, {spate.Durable, "cl.x."}} {
		ch := mustWatch(e, s, w.ks, w.pre)
		readSnapshot(e, ch)
		chans = append(chans, ch)
	}
	require.NoError(e.t, s.Close(), "close")
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for i, ch := range chans {
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			case <-timer.C:
				e.t.Fatalf("rule: Close ends every open watch; watch %d of %d is still open %v after Close", i+1, len(chans), eventWait)
			}
		}
	}
	assert.NoError(e.t, s.Close(), "rule: Close is idempotent; a second Close failed")
	assert.NoError(e.t, s.Close(), "rule: Close is idempotent; a third Close failed")
	en, ok := mustGet(e, other, spate.Durable, "cl.k")
	assert.True(e.t, ok && en.Revision == r, "rule: Close releases only what the driver started; another client lost %q", "cl.k")
	_, err := other.Create(e.ctx, spate.Durable, "cl.other", []byte("v"))
	assert.NoError(e.t, err, "rule: Close releases only what the driver started; another client's create failed")
}

// testCallsAfterClose: after Close every primitive fails with ErrClosed
// and ErrFatal, whatever its arguments.
func testCallsAfterClose(e *env) {
	s := e.open()
	r := mustCreate(e, s, spate.Durable, "uac.k", "v")
	require.NoError(e.t, s.Close(), "close")
	for _, ks := range keyspaces {
		errs := allOps(e.ctx, s, ks, "uac.k", r)
		for _, op := range opNames {
			require.Error(e.t, errs[op], "rule: after Close every method fails; %s %s succeeded", ks, op)
			assert.ErrorIs(e.t, errs[op], spate.ErrClosed, "rule: after Close every method fails with ErrClosed; %s %s returned %v", ks, op, errs[op])
			assert.ErrorIs(e.t, errs[op], spate.ErrFatal, "rule: after Close every method fails Fatal; %s %s returned %v", ks, op, errs[op])
		}
	}
}
