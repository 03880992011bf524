package conformance

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// StoreRules are the rules of [RunStore] and [CheckStore], in the order they
// run. Each checks one sentence of the store contract, quoted in its
// Contract; the package documentation maps every sentence of the contract
// to its rules. The rules of the optional [spate.Releaser] capability come
// last; a store without it skips them.
var StoreRules = slices.Concat([]Rule{
	{Name: "DriverIsNamed",
		Contract: `Driver names the backend ("mem", "etcd", "redis", "nats").`,
		body:     testDriverNamed},
	{Name: "RequiredSettingsAreMet",
		Contract: "The conformance suite fails a store that reports any.",
		body:     testRequiredSettingsMet},
	{Name: "TTLIsFixedWhenOpened",
		Contract: "TTL is the ephemeral keyspace's TTL, fixed when the store was opened.",
		body:     testTTLFixed},
	{Name: "TTLFloorIsAtMostTheTTL",
		Contract: "TTLFloor is the smallest TTL the backend supports.",
		body:     testTTLFloor},
	{Name: "CapabilitiesNeverBlock",
		Contract: "It never blocks.",
		body:     testCapabilitiesNeverBlock},
	{Name: "ValueCapIsReported",
		Contract: "MaxValueSize is the largest value in bytes the store accepts; 0 means no cap.",
		body:     testValueCapReported},
	{Name: "ValidKeysAreAccepted",
		Contract: `Keys are 1–256 bytes of [A-Za-z0-9_.-] that neither start nor end with '.' and hold no "..".`,
		body:     testValidKeys},
	{Name: "ValidPrefixesAreAccepted",
		Contract: "A prefix is empty or a key prefix that may end with '.'.",
		body:     testValidPrefixes},
	{Name: "InvalidKeysRejected",
		Contract: "ErrInvalidKey is returned (with ErrFatal) for a key or prefix outside the store key syntax; nothing was written.",
		body:     testInvalidKeys},
	{Name: "InvalidKeyspacesAreFatal",
		Contract: "Fatal: misconfiguration, unsupported server, authentication failure, a keyspace other than [Durable] and [Ephemeral], a value over the size cap ([ErrValueTooLarge]), an invalid key ([ErrInvalidKey]), use after Close ([ErrClosed]).",
		body:     testInvalidKeyspaces},
	{Name: "ValueSizeCap",
		Contract: "ErrValueTooLarge is returned (with ErrFatal) by a store write whose value exceeds the store's reported cap; nothing was written.",
		body:     testOversizedRejected},
	{Name: "FatalWritesWriteNothing",
		Contract: "Nothing was written.",
		body:     testFatalWritesWriteNothing},
	{Name: "ErrorsAreRetryableOrFatal",
		Contract: "Every error satisfies errors.Is with [ErrRetryable] or [ErrFatal]:",
		body:     testErrorsClassified},
	{Name: "CancelledContextIsRetryable",
		Contract: "Retryable: timeouts, transport failures, a cancelled or expired context, a broken or lagged watch.",
		body:     testDeadContextRetryable},
	{Name: "ErrorsKeepTheirCause",
		Contract: "Store drivers keep the backend's error and add the class:",
		body:     testContextCause},
	{Name: "LostConditionsAreOutcomes",
		Contract: "Losing a condition is an outcome ([Outcome.Won] false), not an error.",
		body:     testLostIsOutcome},
	{Name: "CreateIsCreateIfAbsent",
		Contract: "Create writes key if it is absent (deleted and expired keys are absent) and returns Won with the new revision; if the key exists it returns Lost and writes nothing.",
		body:     testCreateIfAbsent},
	{Name: "UpdateIsCompareAndSwap",
		Contract: "Update writes key only if it currently exists at exactly revision expected, returning Won with a strictly larger revision; otherwise Lost.",
		body:     testUpdateCAS},
	{Name: "GetReadsTheLatestWrite",
		Contract: "Get reads key.",
		body:     testGetLatest},
	{Name: "DeletedKeysReadAbsentAndAreRecreatable",
		Contract: "ok is false for an absent key; a deleted or expired key is absent, never a tombstone.",
		body:     testDeletedAbsent},
	{Name: "UnconditionalDeleteWinsEvenWhenAbsent",
		Contract: "With expected == [AnyRevision] it is unconditional and wins even when the key is absent.",
		body:     testUnconditionalDelete},
	{Name: "GuardedDelete",
		Contract: "Otherwise it is guarded: it wins only if the key exists at exactly expected, and a guarded delete of an absent key loses.",
		body:     testGuardedDelete},
	{Name: "OutcomeReportsWhetherTheWriteApplied",
		Contract: "Won reports whether the write applied.",
		body:     testOutcomeWon},
	{Name: "OutcomeRevisionIsTheRevisionMinted",
		Contract: "Revision is the revision the write minted (0 when lost, and for a delete whose backend does not report one).",
		body:     testOutcomeRevision},
	{Name: "DeleteOutcomeCarriesItsRevision",
		Contract: "Outcome.Revision is the delete's revision when the backend reports one, else 0.",
		body:     testDeleteOutcomeRevision},
	{Name: "LiveRevisionsAreNeverZero",
		Contract: "A revision is a store-assigned uint64, never 0 for a live key.",
		body:     testRevisionsNeverZero},
	{Name: "RevisionsIncreaseAcrossDeleteAndRecreate",
		Contract: "It strictly increases per key across the key's whole history, including delete and re-create (a keyspace- or store-wide counter does this; a per-key version that restarts on re-create does not).",
		body:     testRevisionsMonotone},
	{Name: "RevisionsAreContentIndependent",
		Contract: "Revisions are content-independent, so a compare-and-swap has no ABA problem.",
		body:     testContentIndependent},
	{Name: "ConcurrentCASLosesNoUpdate",
		Contract: "The coordinator needs nothing else, and it trusts nothing else: fencing rests on Create and Update being linearizable compare-and-set operations.",
		body:     testConcurrentCAS},
	{Name: "ClientsShareOneNamespace",
		Contract: "The coordinator needs nothing else, and it trusts nothing else: fencing rests on Create and Update being linearizable compare-and-set operations.",
		body:     testClientsShare},
	{Name: "OneClientIsSafeForConcurrentUse",
		Contract: "Every method is safe for concurrent use.",
		body:     testOneClientConcurrent},
	{Name: "KeyspacesAreIndependent",
		Contract: "Keyspace selects one of the store's two keyspaces.",
		body:     testKeyspacesIndependent},
	{Name: "ValuesRoundTrip",
		Contract: "A value is any byte string up to [Capabilities.MaxValueSize] bytes; Get, List and Watch return it byte for byte.",
		body:     testValuesRoundTrip},
	{Name: "EmptyValuesAreValues",
		Contract: "The empty value is a value like any other: its key is live.",
		body:     testEmptyValues},
	{Name: "ListReturnsLiveKeys",
		Contract: "List returns every live key under prefix with value and revision, sorted by key.",
		body:     testListLive},
	{Name: "ListNeverUnderReports",
		Contract: "It never under-reports a key that was live for the whole call: the coordinator treats absence from a listing as a delete.",
		body:     testListNeverUnderReports},
	{Name: "DurableKeysNeverExpire",
		Contract: "[Durable] keys never expire.",
		body:     testDurableNeverExpires},
	{Name: "EphemeralKeyLivesItsWholeTTL",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testEphemeralLivesItsTTL},
	{Name: "ExpiredKeysReadAbsentAndAreRecreatable",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testExpiredAbsent},
	{Name: "UpdatedEphemeralKeyExpiresAfterItsTTL",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testUpdatedExpires},
	{Name: "LostUpdateDoesNotRearmTheTTL",
		Contract: "[Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [Capabilities.TTL].",
		body:     testLostUpdateNoRearm},
	{Name: "HeartbeatedEphemeralKeySurvives",
		Contract: "On the ephemeral keyspace a won Update re-arms the key's TTL: it is the heartbeat.",
		body:     testHeartbeatSurvives},
	{Name: "ExpiryIsOneInstantForEveryPrimitive",
		Contract: "A key expires at one instant between its deadline and [Capabilities.ExpiryLatency] after it, for every primitive alike: from then on it is absent to all of them, and watchers receive a [WatchDelete].",
		body:     testExpiryOneInstant},
	{Name: "ExpiryReachesWatchersAsDelete",
		Contract: "A key expires at one instant between its deadline and [Capabilities.ExpiryLatency] after it, for every primitive alike: from then on it is absent to all of them, and watchers receive a [WatchDelete].",
		body:     testExpiryWatch},
	{Name: "ExpiryReachesWatchersWithinTheLatency",
		Contract: "ExpiryLatency bounds how late after its deadline an expired key's delete reaches watchers (reads never return an expired key).",
		body:     testExpiryLatency},
	{Name: "WatchSnapshotThenOneSnapshotDone",
		Contract: "Watch streams changes under prefix: first a [WatchPut] for every live key (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes, expiry included.",
		body:     testWatchSnapshot},
	{Name: "WatchFiltersByPrefix",
		Contract: "Watch streams changes under prefix: first a [WatchPut] for every live key (the snapshot), then exactly one [WatchSnapshotDone], then live puts and deletes, expiry included.",
		body:     testWatchPrefix},
	{Name: "WatchPutCarriesItsWrite",
		Contract: "WatchPut: Key was written at Revision with Value.",
		body:     testWatchPut},
	{Name: "WatchDeliversDeletes",
		Contract: "A delete has a revision too, greater than every revision the key held before, and watchers receive it.",
		body:     testWatchDeletes},
	{Name: "WatchHasNoGaps",
		Contract: "There are no gaps: the watcher's view always converges to the store's state, across the boundary between snapshot and live stream too.",
		body:     testWatchNoGaps},
	{Name: "WatchDeliversEveryKeysLatestRevision",
		Contract: "Duplicates across that boundary are allowed (consumers de-duplicate by revision), and a revision of a key superseded before it was delivered may be coalesced into the later one (a store that keeps one version per key cannot replay it); the latest revision of every key is always delivered.",
		body:     testWatchLatest},
	{Name: "WatchKeepsEachKeysRevisionOrder",
		Contract: "Events of one key arrive in revision order.",
		body:     testWatchOrder},
	{Name: "LaggingWatcherConvergesOrBreaksRetryable",
		Contract: "A broken stream delivers a [WatchError] as its last event: Retryable for a transient break (a dropped connection, a compacted history, a watcher too slow to keep up), after which the consumer re-watches; Fatal when the stream can never resume (permission revoked, corrupt data).",
		body:     testLaggingWatcher},
	{Name: "WatchSetupErrorsAreReturned",
		Contract: "An error establishing the watch, including a cancelled ctx, is returned directly.",
		body:     testWatchSetupErrors},
	{Name: "CancelledWatchEndsAndCloses",
		Contract: "The stream ends, and the channel closes, when ctx is cancelled, the store is closed, or the stream breaks.",
		body:     testCancelledWatch},
	{Name: "CloseEndsEveryWatchAndIsIdempotent",
		Contract: "Close releases what the driver started (never a client the caller passed in), ends every open watch (its channel closes) and is idempotent.",
		body:     testCloseEndsWatches},
	{Name: "UseAfterClose",
		Contract: "After Close every method returns an error matching both [ErrClosed] and [ErrFatal].",
		body:     testCallsAfterClose},
}, capability("spate.Releaser", releaseRules), capability("spate.KeyWatcher", watchKeysRules), capability("spate.Sessioner", sessionRules))

// capability marks rules as those of the named optional capability.
func capability(name string, rules []Rule) []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		r.Capability = name
		out[i] = r
	}
	return out
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

func mustCreateBytes(e *env, s spate.Store, key string, v []byte) {
	e.t.Helper()
	o, err := s.Create(e.ctx, spate.Durable, key, v)
	if err != nil || !o.Won {
		e.t.Fatalf("create %q of %d bytes: won=%t err=%v", key, len(v), o.Won, err)
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
		if zero := mustUpdate(e, s, ks, "cas.k", "zero", 0); zero.Won {
			e.t.Errorf("rule: update wins only at the exact revision, and no live key is at revision 0; %s update at 0 (current %d) won", ks, r2)
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

// testGetLatest: after every write by one client (a create, four updates),
// a Get by another returns that write's value and revision.
func testGetLatest(e *env) {
	a, b := e.open(), e.open()
	for _, ks := range keyspaces {
		rev := mustCreate(e, a, ks, "gl.k", "v0")
		for i := range 5 {
			if i > 0 {
				o := mustUpdate(e, a, ks, "gl.k", "v"+strconv.Itoa(i), rev)
				require.True(e.t, o.Won, "update at the current revision lost")
				rev = o.Revision
			}
			en, ok := mustGet(e, b, ks, "gl.k")
			require.True(e.t, ok, "rule: Get reads the key; %s %q reads absent after write %d", ks, "gl.k", i)
			assert.Equal(e.t, "v"+strconv.Itoa(i), string(en.Value), "rule: Get reads the latest write; %s %q after write %d", ks, "gl.k", i)
			assert.Equal(e.t, rev, en.Revision, "rule: Get reads the latest write's revision; %s %q after write %d", ks, "gl.k", i)
			assert.Equal(e.t, "gl.k", en.Key, "rule: Get returns the entry of the key it read")
		}
	}
}

func testDeletedAbsent(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		if en, ok := mustGet(e, s, ks, "del.never"); ok {
			e.t.Errorf("rule: ok is false for an absent key; %s %q, never written, reads %q@%d", ks, "del.never", en.Value, en.Revision)
		}
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

// testUnconditionalDelete: a delete at AnyRevision wins on a live key (at
// any revision, after an update too) and removes it, and wins on a key that
// is absent, never written or already deleted.
func testUnconditionalDelete(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		o, err := s.Delete(e.ctx, ks, "ud.never", spate.AnyRevision)
		require.NoError(e.t, err, "unconditional delete of an absent key")
		assert.True(e.t, o.Won, "rule: an unconditional delete wins even when the key is absent; %s delete of never-written %q lost", ks, "ud.never")
		r := mustCreate(e, s, ks, "ud.k", "v")
		u := mustUpdate(e, s, ks, "ud.k", "w", r)
		require.True(e.t, u.Won, "update at the current revision lost")
		o = mustDelete(e, s, ks, "ud.k", spate.AnyRevision)
		assert.True(e.t, o.Won, "rule: an unconditional delete of a live key wins; %s delete of %q lost", ks, "ud.k")
		_, ok := mustGet(e, s, ks, "ud.k")
		assert.False(e.t, ok, "rule: a won delete removes the key; %s %q still reads present", ks, "ud.k")
		o = mustDelete(e, s, ks, "ud.k", spate.AnyRevision)
		assert.True(e.t, o.Won, "rule: an unconditional delete wins even when the key is absent; %s delete of deleted %q lost", ks, "ud.k")
	}
}

// testGuardedDelete: a delete at a revision wins only at the key's current
// revision, and a guarded delete of an absent key loses.
func testGuardedDelete(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		r := mustCreate(e, s, ks, "gd.k", "v")
		assert.False(e.t, mustDelete(e, s, ks, "gd.k", r+1000).Won, "rule: a guarded delete at the wrong revision loses; %s delete at %d (current %d) won", ks, r+1000, r)
		_, ok := mustGet(e, s, ks, "gd.k")
		require.True(e.t, ok, "rule: a lost guarded delete removes nothing; %s %q is gone", ks, "gd.k")
		u := mustUpdate(e, s, ks, "gd.k", "w", r)
		require.True(e.t, u.Won, "update at the current revision lost")
		assert.False(e.t, mustDelete(e, s, ks, "gd.k", r).Won, "rule: a guarded delete at a stale revision loses; %s delete at %d (current %d) won", ks, r, u.Revision)
		assert.True(e.t, mustDelete(e, s, ks, "gd.k", u.Revision).Won, "rule: a guarded delete at the current revision wins; %s delete at %d lost", ks, u.Revision)
		_, ok = mustGet(e, s, ks, "gd.k")
		assert.False(e.t, ok, "rule: a won delete removes the key; %s %q still reads present", ks, "gd.k")
		assert.False(e.t, mustDelete(e, s, ks, "gd.k", u.Revision).Won, "rule: a guarded delete of an absent key loses; %s delete of deleted %q at %d won", ks, "gd.k", u.Revision)
		assert.False(e.t, mustDelete(e, s, ks, "gd.never", r).Won, "rule: a guarded delete of an absent key loses; %s delete of never-written %q won", ks, "gd.never")
	}
}

// testOutcomeWon: Won is true exactly when the write applied: each won
// create, update and delete shows in a Get by another client, each lost
// one leaves the key as it was.
func testOutcomeWon(e *env) {
	s, other := e.open(), e.open()
	for _, ks := range keyspaces {
		e.withinATTL(s, ks, func(attempt int) string {
			key := fmt.Sprintf("ow.k%d", attempt)
			read := func() string {
				en, ok := mustGet(e, other, ks, key)
				if !ok {
					return "absent"
				}
				return fmt.Sprintf("%s@%d", en.Value, en.Revision)
			}
			// step judges one write: whether it applied, by what other
			// reads before and after it.
			step := func(what string, o spate.Outcome, err error, before string, applied func(now string) bool) string {
				if err != nil {
					return fmt.Sprintf("%s %s: unexpected error: %v", ks, what, err)
				}
				now := read()
				if applied(now) != o.Won {
					return fmt.Sprintf("rule: Won reports whether the write applied; %s %s reported Won=%t, and the key went %s -> %s",
						ks, what, o.Won, before, now)
				}
				return ""
			}
			changed := func(before string) func(string) bool { return func(now string) bool { return now != before } }
			before := read()
			c, err := s.Create(e.ctx, ks, key, []byte("a"))
			if f := step("create of an absent key", c, err, before, changed(before)); f != "" {
				return f
			}
			before = read()
			o, err := s.Create(e.ctx, ks, key, []byte("b"))
			if f := step("create of a live key", o, err, before, changed(before)); f != "" {
				return f
			}
			before = read()
			u, err := s.Update(e.ctx, ks, key, []byte("c"), c.Revision)
			if f := step("update at the current revision", u, err, before, changed(before)); f != "" {
				return f
			}
			before = read()
			o, err = s.Update(e.ctx, ks, key, []byte("d"), c.Revision)
			if f := step("update at a stale revision", o, err, before, changed(before)); f != "" {
				return f
			}
			before = read()
			o, err = s.Delete(e.ctx, ks, key, c.Revision)
			if f := step("guarded delete at a stale revision", o, err, before, changed(before)); f != "" {
				return f
			}
			before = read()
			o, err = s.Delete(e.ctx, ks, key, u.Revision)
			return step("guarded delete at the current revision", o, err, before, func(now string) bool { return now == "absent" })
		})
	}
}

// testOutcomeRevision: a won create or update reports the revision Get,
// List and a watcher then see for the key; every lost write (a create of a
// live key, an update at a stale revision or of an absent key, a guarded
// delete at a stale revision or of an absent key) reports revision 0.
func testOutcomeRevision(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "or.")
		readSnapshot(e, ch)
		minted := func(what string, o spate.Outcome) {
			e.t.Helper()
			require.True(e.t, o.Won, "%s lost", what)
			en, ok := mustGet(e, s, ks, "or.k")
			require.True(e.t, ok, "%s: the key reads absent", what)
			assert.Equal(e.t, o.Revision, en.Revision, "rule: a won write reports the revision it minted; %s %s reported %d, Get reads %d", ks, what, o.Revision, en.Revision)
			assert.Equal(e.t, map[string]uint64{"or.k": o.Revision}, listMap(e, s, ks, "or."), "rule: a won write reports the revision it minted; %s %s, as listed", ks, what)
			ev := expectEvent(e, ch, "or.k", eventWait)
			assert.Equal(e.t, o.Revision, ev.Revision, "rule: a won write reports the revision it minted; %s %s, as watched", ks, what)
		}
		lost := func(what string, o spate.Outcome, err error) {
			e.t.Helper()
			require.NoError(e.t, err, "%s %s", ks, what)
			require.False(e.t, o.Won, "%s %s won", ks, what)
			assert.Zero(e.t, o.Revision, "rule: a lost write reports revision 0; %s %s reported %d", ks, what, o.Revision)
		}
		c := mustCreate(e, s, ks, "or.k", "a")
		minted("create", spate.Won(c))
		u := mustUpdate(e, s, ks, "or.k", "b", c)
		minted("update", u)
		o, err := s.Create(e.ctx, ks, "or.k", []byte("x"))
		lost("create of a live key", o, err)
		o, err = s.Update(e.ctx, ks, "or.k", []byte("x"), c)
		lost("update at a stale revision", o, err)
		o, err = s.Update(e.ctx, ks, "or.absent", []byte("x"), u.Revision)
		lost("update of an absent key", o, err)
		o, err = s.Delete(e.ctx, ks, "or.k", c)
		lost("guarded delete at a stale revision", o, err)
		o, err = s.Delete(e.ctx, ks, "or.absent", u.Revision)
		lost("guarded delete of an absent key", o, err)
	}
}

// testDeleteOutcomeRevision: a won delete of a live key (guarded or not)
// reports either 0 or the revision its delete event carries, which exceeds
// the key's last put.
func testDeleteOutcomeRevision(e *env) {
	s := e.open()
	reported := 0
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "dor.")
		readSnapshot(e, ch)
		for _, guarded := range []bool{true, false} {
			r := mustCreate(e, s, ks, "dor.k", "v")
			require.Equal(e.t, spate.WatchPut, expectEvent(e, ch, "dor.k", eventWait).Kind, "a create reaches watchers as a put")
			expected := spate.AnyRevision
			if guarded {
				expected = r
			}
			o := mustDelete(e, s, ks, "dor.k", expected)
			require.True(e.t, o.Won, "delete of a live key lost")
			ev := expectEvent(e, ch, "dor.k", eventWait)
			require.Equal(e.t, spate.WatchDelete, ev.Kind, "rule: a delete reaches watchers as a delete")
			if o.Revision != 0 {
				reported++
				assert.Equal(e.t, ev.Revision, o.Revision, "rule: a delete's outcome carries the delete's revision; %s delete (guarded %t) reported %d, its event %d",
					ks, guarded, o.Revision, ev.Revision)
			}
		}
	}
	e.t.Logf("the backend reported the revision of %d of 4 deletes", reported)
}

// testRevisionsNeverZero: in a fresh namespace, the first keys written to
// each keyspace, and everything after, carry revisions other than 0 in
// every outcome, read, listing and event.
func testRevisionsNeverZero(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "")
		readSnapshot(e, ch)
		for _, k := range []string{"nz.a", "nz.b"} {
			o, err := s.Create(e.ctx, ks, k, []byte("v"))
			require.NoError(e.t, err, "create")
			require.True(e.t, o.Won, "create of an absent key lost")
			assert.NotZero(e.t, o.Revision, "rule: a live key's revision is never 0; %s create of %q", ks, k)
			en, _ := mustGet(e, s, ks, k)
			assert.NotZero(e.t, en.Revision, "rule: a live key's revision is never 0; %s get of %q", ks, k)
			assert.NotZero(e.t, expectEvent(e, ch, k, eventWait).Revision, "rule: a live key's revision is never 0; %s put event of %q", ks, k)
			u := mustUpdate(e, s, ks, k, "w", o.Revision)
			require.True(e.t, u.Won, "update at the current revision lost")
			assert.NotZero(e.t, u.Revision, "rule: a live key's revision is never 0; %s update of %q", ks, k)
		}
		for _, en := range mustList(e, s, ks, "nz.") {
			assert.NotZero(e.t, en.Revision, "rule: a live key's revision is never 0; %s listing of %q", ks, en.Key)
		}
	}
}

func mustList(e *env, s spate.Store, ks spate.Keyspace, prefix string) []spate.Entry {
	e.t.Helper()
	list, err := s.List(e.ctx, ks, prefix)
	require.NoError(e.t, err, "list %s %q", ks, prefix)
	return list
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

// testContentIndependent: a key written A, then B, then A again holds a
// revision other than its first, and a compare-and-swap (an update, a
// guarded delete) at the first revision loses: no ABA.
func testContentIndependent(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		r1 := mustCreate(e, s, ks, "aba.k", "A")
		o := mustUpdate(e, s, ks, "aba.k", "B", r1)
		require.True(e.t, o.Won, "update at the current revision lost")
		o = mustUpdate(e, s, ks, "aba.k", "A", o.Revision)
		require.True(e.t, o.Won, "update at the current revision lost")
		r3 := o.Revision
		assert.NotEqual(e.t, r1, r3, "rule: revisions are content-independent; %s %q holds %q at its first revision again", ks, "aba.k", "A")
		assert.False(e.t, mustUpdate(e, s, ks, "aba.k", "C", r1).Won, "rule: a compare-and-swap has no ABA problem; %s update at the first revision of A won after A-B-A", ks)
		assert.False(e.t, mustDelete(e, s, ks, "aba.k", r1).Won, "rule: a compare-and-swap has no ABA problem; %s guarded delete at the first revision of A won after A-B-A", ks)
		en, _ := mustGet(e, s, ks, "aba.k")
		assert.Equal(e.t, r3, en.Revision, "%s %q's revision", ks, "aba.k")
	}
}

// testConcurrentCAS: four clients increment one counter in 20 rounds; in
// each round all four read the same revision, then all four update at it
// at once. Exactly one update wins per round, the counter ends at 20, and
// the recorded history is linearizable (porcupine).
func testConcurrentCAS(e *env) {
	const clients, rounds = 4, 20
	stores := make([]spate.Store, clients)
	for i := range stores {
		stores[i] = e.open()
	}
	rec := &History{}
	if o, err := (Recorder{H: rec, Client: 0, Store: stores[0]}).Create(e.ctx, spate.Durable, "ctr", []byte("0")); err != nil || !o.Won {
		e.t.Fatalf("create counter: won=%t err=%v", o.Won, err)
	}
	for round := 1; round <= rounds; round++ {
		var (
			read, wrote sync.WaitGroup
			mu          sync.Mutex
			won         int
			errs        []error
		)
		read.Add(clients)
		for c := range clients {
			wrote.Go(func() {
				s := stores[c]
				en, ok, err := Recorder{H: rec, Client: c, Store: s}.Get(e.ctx, spate.Durable, "ctr")
				read.Done()
				if err != nil || !ok {
					mu.Lock()
					errs = append(errs, fmt.Errorf("client %d get: ok=%t err=%v", c, ok, err))
					mu.Unlock()
					return
				}
				read.Wait() // every client has read this round's revision
				time.Sleep(time.Duration(rand.IntN(2)) * time.Millisecond)
				v, _ := strconv.Atoi(string(en.Value))
				o, err := Recorder{H: rec, Client: c, Store: s}.Update(e.ctx, spate.Durable, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("client %d update: %v", c, err))
				} else if o.Won {
					won++
				}
			})
		}
		wrote.Wait()
		require.Empty(e.t, errs, "round %d", round)
		require.Equal(e.t, 1, won, "rule: compare-and-swap is linearizable: of %d updates at one revision exactly one wins; round %d had %d winners",
			clients, round, won)
	}
	en, _ := mustGet(e, stores[0], spate.Durable, "ctr")
	assert.Equal(e.t, strconv.Itoa(rounds), string(en.Value), "rule: concurrent compare-and-swap increments lose no update")
	e.after = append(e.after, func(t testing.TB) { // outside the bubble: a real-time timeout
		if ok, info := rec.Check(30 * time.Second); !ok {
			t.Errorf("rule: create and update are linearizable compare-and-swap operations; porcupine found no linearization of %d operations: %s",
				rec.Len(), info)
		}
	})
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

// testOneClientConcurrent: one client used by 8 goroutines at once, each
// creating, reading and updating 10 keys of its own with values of its
// own while another goroutine lists: every key ends with its own
// goroutine's last value.
func testOneClientConcurrent(e *env) {
	s := e.open()
	const workers, keys = 8, 10
	stop := make(chan struct{})
	var lister sync.WaitGroup
	lists := 0
	lister.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.List(e.ctx, spate.Durable, "cu."); err != nil {
				return
			}
			lists++
			time.Sleep(time.Millisecond)
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range keys {
				k := fmt.Sprintf("cu.%d.%d", w, i)
				v := fmt.Sprintf("w%d-k%d", w, i)
				o, err := s.Create(e.ctx, spate.Durable, k, []byte(v))
				if err != nil || !o.Won {
					errs <- fmt.Errorf("create %q: won=%t err=%v", k, o.Won, err)
					return
				}
				en, ok, err := s.Get(e.ctx, spate.Durable, k)
				if err != nil || !ok || string(en.Value) != v {
					errs <- fmt.Errorf("rule: every method is safe for concurrent use; %q read %q (present %t, err %v) right after its create of %q", k, en.Value, ok, err, v)
					return
				}
				if o, err = s.Update(e.ctx, spate.Durable, k, []byte(v+"-2"), o.Revision); err != nil || !o.Won {
					errs <- fmt.Errorf("update %q: won=%t err=%v", k, o.Won, err)
					return
				}
				time.Sleep(time.Millisecond) // let the others and the lister in
			}
		})
	}
	wg.Wait()
	close(stop)
	lister.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("%v", err)
	}
	list := mustList(e, s, spate.Durable, "cu.")
	require.Len(e.t, list, workers*keys, "rule: every method is safe for concurrent use; %d concurrent creates left %d keys", workers*keys, len(list))
	for _, en := range list {
		var w, i int
		_, _ = fmt.Sscanf(en.Key, "cu.%d.%d", &w, &i)
		assert.Equal(e.t, fmt.Sprintf("w%d-k%d-2", w, i), string(en.Value), "rule: every method is safe for concurrent use; %q holds another call's value", en.Key)
	}
	e.t.Logf("%d goroutines x %d keys, %d listings meanwhile", workers, keys, lists)
}

func testKeyspacesIndependent(e *env) {
	s := e.open()
	rd := mustCreate(e, s, spate.Durable, "ks.k", "durable")
	o, err := s.Create(e.ctx, spate.Ephemeral, "ks.k", []byte("ephemeral"))
	require.NoError(e.t, err, "create")
	require.True(e.t, o.Won, "rule: the two keyspaces are independent; an ephemeral create of %q lost to the durable key", "ks.k")
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

// testValuesRoundTrip: values of every byte, empty to 4 KiB, come back byte
// for byte through Get, List and Watch, in both keyspaces.
func testValuesRoundTrip(e *env) {
	s := e.open()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	values := map[string][]byte{"rt.empty": {}, "rt.bytes": all, "rt.big": bytes.Repeat(all, 16), "rt.nul": {0}, "rt.text": []byte("héllo\n")}
	keys := slices.Sorted(maps.Keys(values))
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "rt.")
		readSnapshot(e, ch)
		for _, k := range keys {
			o, err := s.Create(e.ctx, ks, k, values[k])
			require.NoError(e.t, err, "create %q", k)
			require.True(e.t, o.Won, "create of an absent key lost")
			ev := expectEvent(e, ch, k, eventWait)
			assert.True(e.t, bytes.Equal(ev.Value, values[k]), "rule: values round-trip byte for byte through Watch; %s %q delivered %q, want %q", ks, k, ev.Value, values[k])
			en, _ := mustGet(e, s, ks, k)
			assert.True(e.t, bytes.Equal(en.Value, values[k]), "rule: values round-trip byte for byte through Get; %s %q read %q, want %q", ks, k, en.Value, values[k])
		}
		list := mustList(e, s, ks, "rt.")
		require.Len(e.t, list, len(values), "%s listing", ks)
		for _, en := range list {
			assert.True(e.t, bytes.Equal(en.Value, values[en.Key]), "rule: values round-trip byte for byte through List; %s %q listed %q", ks, en.Key, en.Value)
		}
	}
}

// testEmptyValues: an empty value (nil or zero-length) is written like any
// other: its key is live to Get, List and Watch, a create of it loses, it
// can be updated to and from, and deleted at its revision.
func testEmptyValues(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "ev.")
		readSnapshot(e, ch)
		revs := map[string]uint64{}
		for k, v := range map[string][]byte{"ev.nil": nil, "ev.zero": {}} {
			o, err := s.Create(e.ctx, ks, k, v)
			require.NoError(e.t, err, "rule: the empty value is a value; %s create of %q with %#v", ks, k, v)
			require.True(e.t, o.Won, "create of an absent key lost")
			revs[k] = o.Revision
			ev := expectEvent(e, ch, k, eventWait)
			assert.Equal(e.t, spate.WatchPut, ev.Kind, "rule: the empty value is a value; %s %q reached the watcher as a %v", ks, k, ev.Kind)
			assert.Empty(e.t, ev.Value, "%s %q's put event", ks, k)
			en, ok := mustGet(e, s, ks, k)
			assert.True(e.t, ok, "rule: a key with the empty value is live; %s %q reads absent", ks, k)
			assert.Empty(e.t, en.Value, "%s %q's value", ks, k)
			assert.Equal(e.t, o.Revision, en.Revision, "%s %q's revision", ks, k)
			c, err := s.Create(e.ctx, ks, k, []byte("x"))
			require.NoError(e.t, err, "create")
			assert.False(e.t, c.Won, "rule: a key with the empty value is live; %s create over %q won", ks, k)
		}
		assert.Equal(e.t, revs, listMap(e, s, ks, "ev."), "rule: keys with the empty value are live; %s listing", ks)
		u := mustUpdate(e, s, ks, "ev.zero", "x", revs["ev.zero"])
		require.True(e.t, u.Won, "update from the empty value lost")
		u = mustUpdate(e, s, ks, "ev.zero", "", u.Revision)
		require.True(e.t, u.Won, "rule: the empty value is a value; %s update to it lost", ks)
		en, ok := mustGet(e, s, ks, "ev.zero")
		assert.True(e.t, ok && len(en.Value) == 0 && en.Revision == u.Revision,
			"rule: a key updated to the empty value is live; %s reads %q@%d (present %t)", ks, en.Value, en.Revision, ok)
		assert.True(e.t, mustDelete(e, s, ks, "ev.zero", u.Revision).Won, "rule: a key with the empty value is live; %s guarded delete at its revision lost", ks)
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

// testListNeverUnderReports lists, 15 times, 40 stable keys (updated now
// and then) while another client churns: keys created and deleted among
// them (sorting before them), updates of the stable keys. Every stable
// key must be in every listing, and the rule must see the churn: the
// listings differ from one another.
func testListNeverUnderReports(e *env) {
	s := e.open()
	churner := e.open()
	const stable = 40
	ttl := s.Capabilities().TTL
	for _, ks := range keyspaces {
		revs := make([]uint64, stable)
		// written: when the write that keeps each stable key live was
		// sent. An ephemeral key lives at least a TTL after it; the
		// churner re-arms each in turn, but on a loaded machine a round
		// of it (or the creates) can outlast the TTL, and the key then
		// expires as it should.
		var mu sync.Mutex
		written := make([]time.Time, stable)
		for i := range stable {
			written[i] = time.Now()
			revs[i] = mustCreate(e, s, ks, fmt.Sprintf("lu.stable.%02d", i), "v")
		}
		ctx, cancel := context.WithCancel(e.ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("lu.churn.%d", i%7)
				if o, err := churner.Create(ctx, ks, k, []byte("x")); err == nil && o.Won {
					time.Sleep(time.Millisecond) // live across a listing's round trips
					_, _ = churner.Delete(ctx, ks, k, o.Revision)
				}
				j := i % stable
				at := time.Now()
				if o, err := churner.Update(ctx, ks, fmt.Sprintf("lu.stable.%02d", j), []byte("y"), revs[j]); err == nil && o.Won {
					revs[j] = o.Revision
					mu.Lock()
					written[j] = at
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		})
		seen := map[string]bool{}
		for round := range 15 {
			mu.Lock()
			before := slices.Clone(written)
			mu.Unlock()
			list, err := s.List(e.ctx, ks, "lu.")
			if err != nil {
				cancel()
				wg.Wait()
				e.t.Fatalf("list: %v", err)
			}
			have := map[string]bool{}
			var state []string
			for _, en := range list {
				have[en.Key] = true
				state = append(state, fmt.Sprintf("%s@%d", en.Key, en.Revision))
			}
			seen[fmt.Sprint(state)] = true
			end := time.Now()
			for i := range stable {
				if ks == spate.Ephemeral && end.Sub(before[i]) >= ttl {
					continue // not live for the whole call: it may have expired
				}
				if k := fmt.Sprintf("lu.stable.%02d", i); !have[k] {
					cancel()
					wg.Wait()
					e.t.Fatalf("rule: a listing never under-reports a key live for the whole call; %s listing %d misses %q (%d entries)",
						ks, round, k, len(list))
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		require.Greater(e.t, len(seen), 1, "the %s listings never changed: the rule listed nothing under churn", ks)
		e.t.Logf("%s: 15 listings under churn, %d distinct", ks, len(seen))
	}
}
