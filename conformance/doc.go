// Package conformance proves that a [spate.Store] driver keeps the store
// contract, and that the coordinator keeps fencing and monotone watermarks
// on top of it. It is the same suite for every driver, ours or a user's.
//
// A driver opts in with a few lines of test:
//
//	func TestConformance(t *testing.T) {
//		conformance.RunStore(t, func(t testing.TB) conformance.Harness {
//			return newHarness(t) // a fresh namespace on a real server
//		})
//	}
//
// Every rule is one named subtest whose failure message states the rule it
// saw broken, so a failing run reads like a list of broken promises. The
// same rules run without a testing.T through [CheckStore] and
// [CheckCoordinator], which return an error as testing/fstest.TestFS does;
// spate conformance runs them that way against a live deployment.
//
// The suite is itself tested: this package's tests run it against
// deliberately broken drivers, at least one per rule, and require each to be
// caught.
//
// The rules of an optional capability ([spate.Releaser]: ReleaserIsReported
// and the Release* rules; [spate.KeyWatcher]: KeyWatcherIsReported and the
// WatchKeys* rules; [spate.Sessioner]: SessionerIsReported and the session
// rules) run on a store that has it and skip, with the reason, on one that
// does not: a SKIP under [RunStore], a Skipped [Result] under [CheckStore],
// never a silent pass.
//
// # Traceability
//
// Each store rule checks one sentence of the store contract: the
// documentation of [spate.Store], its methods and types, and of the error
// classes in errors.go. Below is every sentence of that contract, in its
// order, with the rules that check it. Of its 142 sentences, 73 are quoted
// by the 81 rules of [StoreRules], 31 restate or sum up sentences whose
// rules check them too, and 38 no rule can check, for the reason given.
// A test keeps this list, the contract and the rules in step.
//
// Store:
//
//   - Store is the contract every coordination store driver implements: six primitives over two keyspaces. — no rule: it introduces the interface; the compiler checks the six primitives.
//   - The coordinator needs nothing else, and it trusts nothing else: fencing rests on Create and Update being linearizable compare-and-set operations. — checked by ConcurrentCASLosesNoUpdate, ClientsShareOneNamespace.
//   - [spate.Durable] keys never expire. — checked by DurableKeysNeverExpire.
//   - [spate.Ephemeral] keys expire one fixed TTL after their last write (create or update), measured on the store's clock from no earlier than the start of the write call; the TTL is fixed when the store is opened and reported by [spate.Capabilities.TTL]. — checked by EphemeralKeyLivesItsWholeTTL, ExpiredKeysReadAbsentAndAreRecreatable, UpdatedEphemeralKeyExpiresAfterItsTTL, LostUpdateDoesNotRearmTheTTL.
//   - A key expires at one instant between its deadline and [spate.Capabilities.ExpiryLatency] after it, for every primitive alike: from then on it is absent to all of them, and watchers receive a [spate.WatchDelete]. — checked by ExpiryIsOneInstantForEveryPrimitive, ExpiryReachesWatchersAsDelete.
//   - A revision is a store-assigned uint64, never 0 for a live key. — checked by LiveRevisionsAreNeverZero.
//   - It strictly increases per key across the key's whole history, including delete and re-create (a keyspace- or store-wide counter does this; a per-key version that restarts on re-create does not). — checked by RevisionsIncreaseAcrossDeleteAndRecreate.
//   - Revisions are content-independent, so a compare-and-swap has no ABA problem. — checked by RevisionsAreContentIndependent.
//   - A delete has a revision too, greater than every revision the key held before, and watchers receive it. — checked by WatchDeliversDeletes.
//   - Losing a condition is an outcome ([spate.Outcome.Won] false), not an error. — checked by LostConditionsAreOutcomes.
//   - Every error satisfies errors.Is with [spate.ErrRetryable] or [spate.ErrFatal]: — checked by ErrorsAreRetryableOrFatal.
//   - Retryable: timeouts, transport failures, a cancelled or expired context, a broken or lagged watch. — checked by CancelledContextIsRetryable, LaggingWatcherConvergesOrBreaksRetryable.
//   - A write that fails Retryable may have landed; the caller re-reads to find out. — no rule: it permits and instructs the caller; a driver cannot break it.
//   - Fatal: misconfiguration, unsupported server, authentication failure, a keyspace other than [spate.Durable] and [spate.Ephemeral], a value over the size cap ([spate.ErrValueTooLarge]), an invalid key ([spate.ErrInvalidKey]), use after Close ([spate.ErrClosed]). — checked by InvalidKeyspacesAreFatal, InvalidKeysRejected, ValueSizeCap, UseAfterClose.
//   - Nothing was written. — checked by FatalWritesWriteNothing, InvalidKeysRejected, ValueSizeCap, InvalidKeyspacesAreFatal.
//   - Drivers make one attempt per call; retries live in the coordinator. — no rule: the suite cannot put a transient failure between a driver and its server, so it cannot count attempts.
//   - The one exception, kept for correctness, is stores/nats on a replicated stream: a compare-and-set the stream leader refuses with 10164 (another write of the same key is still being replicated, and nothing was written) is not decided yet, and reporting it Lost broke linearizability (a read just after still saw the revision the Lost declared gone) while reporting it Retryable would fail plain contention on a healthy cluster, so the driver sends it again until the leader decides, for at most two seconds. — no rule: a property of one driver on a replicated cluster; stores/nats TestFailoverCASIsLinearizable checks it with porcupine on R3.
//   - Its Create of a deleted or expired key is likewise one read and one compare-and-set at the delete marker's revision, repeated (four rounds at most) only while the marker moves under it, so that it loses only after a read saw a live value. — no rule: a property of one driver; CreateIsCreateIfAbsent and DeletedKeysReadAbsentAndAreRecreatable check its outcome.
//   - Keys are 1–256 bytes of [A-Za-z0-9_.-] that neither start nor end with '.' and hold no "..". — checked by ValidKeysAreAccepted.
//   - A prefix is empty or a key prefix that may end with '.'. — checked by ValidPrefixesAreAccepted.
//   - See [spate.ValidateKey]. — no rule: a reference.
//   - A value is any byte string up to [spate.Capabilities.MaxValueSize] bytes; Get, List and Watch return it byte for byte. — checked by ValuesRoundTrip.
//   - The empty value is a value like any other: its key is live. — checked by EmptyValuesAreValues.
//   - Every method is safe for concurrent use. — checked by OneClientIsSafeForConcurrentUse.
//   - Close releases what the driver started (never a client the caller passed in), ends every open watch (its channel closes) and is idempotent. — checked by CloseEndsEveryWatchAndIsIdempotent.
//   - After Close every method returns an error matching both [spate.ErrClosed] and [spate.ErrFatal]. — checked by UseAfterClose.
//   - A call in flight when Close begins has its context cancelled, and Close waits for it to return before it closes the backend, so that no call reaches a backend after Close. — no rule: the suite sees the Store, not the backend behind it; the root's TestPortableCloseCancelsAndWaitsForCallsInFlight and TestPortableCloseRacingCalls check it with a counting Driver.
//   - Every driver is a [github.com/spate-go/spate/driver.Driver] wrapped by driver.NewStore, whose PortableStore holds, once for all drivers, the closed state, the tracking of calls in flight, the argument checks, the value cap, the revision-0 rule of Update and the error format (driver.OpError); the driver does the backend's part and classifies its own errors. — no rule: it describes how drivers are built, not what a store does; the root's TestPortable tests check the PortableStore.
//
// Store.Capabilities:
//
//   - Capabilities reports what the driver promises. — checked by DriverIsNamed, TTLIsFixedWhenOpened, TTLFloorIsAtMostTheTTL, ValueCapIsReported, ExpiryReachesWatchersWithinTheLatency.
//   - It never blocks. — checked by CapabilitiesNeverBlock.
//
// Store.Create:
//
//   - Create writes key if it is absent (deleted and expired keys are absent) and returns Won with the new revision; if the key exists it returns Lost and writes nothing. — checked by CreateIsCreateIfAbsent.
//
// Store.Update:
//
//   - Update writes key only if it currently exists at exactly revision expected, returning Won with a strictly larger revision; otherwise Lost. — checked by UpdateIsCompareAndSwap.
//   - expected must be a revision read from a live value (a create, update, get, listing or put event); an Update at the revision of a delete is undefined (some stores cannot tell a delete marker from a value). — no rule: it binds the caller, and leaves undefined what it excludes.
//   - On the ephemeral keyspace a won Update re-arms the key's TTL: it is the heartbeat. — checked by HeartbeatedEphemeralKeySurvives.
//
// Store.Get:
//
//   - Get reads key. — checked by GetReadsTheLatestWrite.
//   - ok is false for an absent key; a deleted or expired key is absent, never a tombstone. — checked by DeletedKeysReadAbsentAndAreRecreatable.
//
// Store.Delete:
//
//   - Delete removes key. — checked by GuardedDelete, UnconditionalDeleteWinsEvenWhenAbsent.
//   - With expected == [spate.AnyRevision] it is unconditional and wins even when the key is absent. — checked by UnconditionalDeleteWinsEvenWhenAbsent.
//   - Otherwise it is guarded: it wins only if the key exists at exactly expected, and a guarded delete of an absent key loses. — checked by GuardedDelete.
//   - Outcome.Revision is the delete's revision when the backend reports one, else 0. — checked by DeleteOutcomeCarriesItsRevision.
//
// Store.Watch:
//
//   - Watch streams changes under prefix: first a [spate.WatchPut] for every live key (the snapshot), then exactly one [spate.WatchSnapshotDone], then live puts and deletes, expiry included. — checked by WatchSnapshotThenOneSnapshotDone, WatchFiltersByPrefix.
//   - There are no gaps: the watcher's view always converges to the store's state, across the boundary between snapshot and live stream too. — checked by WatchHasNoGaps.
//   - Duplicates across that boundary are allowed (consumers de-duplicate by revision), and a revision of a key superseded before it was delivered may be coalesced into the later one (a store that keeps one version per key cannot replay it); the latest revision of every key is always delivered. — checked by WatchDeliversEveryKeysLatestRevision.
//   - Events of one key arrive in revision order. — checked by WatchKeepsEachKeysRevisionOrder.
//   - The stream ends, and the channel closes, when ctx is cancelled, the store is closed, or the stream breaks. — checked by CancelledWatchEndsAndCloses.
//   - A broken stream delivers a [spate.WatchError] as its last event: Retryable for a transient break (a dropped connection, a compacted history, a watcher too slow to keep up), after which the consumer re-watches; Fatal when the stream can never resume (permission revoked, corrupt data). — checked by LaggingWatcherConvergesOrBreaksRetryable.
//   - An error establishing the watch, including a cancelled ctx, is returned directly. — checked by WatchSetupErrorsAreReturned.
//
// Store.List:
//
//   - List returns every live key under prefix with value and revision, sorted by key. — checked by ListReturnsLiveKeys.
//   - It never under-reports a key that was live for the whole call: the coordinator treats absence from a listing as a delete. — checked by ListNeverUnderReports.
//
// Store.Close:
//
//   - Close releases the driver's resources; see the type documentation. — checked by CloseEndsEveryWatchAndIsIdempotent, UseAfterClose.
//
// Keyspace:
//
//   - Keyspace selects one of the store's two keyspaces. — checked by KeyspacesAreIndependent.
//
// Durable:
//
//   - Durable keys never expire. — checked by DurableKeysNeverExpire.
//
// Ephemeral:
//
//   - Ephemeral keys expire one TTL after their last write. — checked by EphemeralKeyLivesItsWholeTTL, ExpiredKeysReadAbsentAndAreRecreatable, UpdatedEphemeralKeyExpiresAfterItsTTL, LostUpdateDoesNotRearmTheTTL.
//
// AnyRevision:
//
//   - AnyRevision as the expected revision of [spate.Store.Delete] makes the delete unconditional. — checked by UnconditionalDeleteWinsEvenWhenAbsent.
//
// Outcome:
//
//   - Outcome is the result of a conditional write. — no rule: it introduces the type.
//   - The zero Outcome is Lost. — no rule: a property of the Go type, not of a driver.
//
// Outcome.Won:
//
//   - Won reports whether the write applied. — checked by OutcomeReportsWhetherTheWriteApplied.
//
// Outcome.Revision:
//
//   - Revision is the revision the write minted (0 when lost, and for a delete whose backend does not report one). — checked by OutcomeRevisionIsTheRevisionMinted.
//
// Entry:
//
//   - Entry is one live key. — checked by ListReturnsLiveKeys, DeletedKeysReadAbsentAndAreRecreatable.
//
// WatchEventKind:
//
//   - WatchEventKind tells the watch events apart. — no rule: it introduces the type.
//
// WatchPut:
//
//   - WatchPut: Key was written at Revision with Value. — checked by WatchPutCarriesItsWrite.
//
// WatchDelete:
//
//   - WatchDelete: Key was deleted or expired at Revision. — checked by WatchDeliversDeletes, ExpiryReachesWatchersAsDelete.
//
// WatchSnapshotDone:
//
//   - WatchSnapshotDone: every key live when the watch began has been delivered. — checked by WatchSnapshotThenOneSnapshotDone, WatchHasNoGaps.
//
// WatchError:
//
//   - WatchError: the stream broke; Err says why. — checked by LaggingWatcherConvergesOrBreaksRetryable.
//   - It is the last event. — checked by LaggingWatcherConvergesOrBreaksRetryable.
//
// WatchEvent:
//
//   - WatchEvent is one item of a watch stream. — no rule: it introduces the type.
//
// Capabilities:
//
//   - Capabilities is what a driver reports about itself. — no rule: it introduces the type.
//
// Capabilities.Driver:
//
//   - Driver names the backend ("mem", "etcd", "redis", "nats"). — checked by DriverIsNamed.
//
// Capabilities.TTL:
//
//   - TTL is the ephemeral keyspace's TTL, fixed when the store was opened. — checked by TTLIsFixedWhenOpened.
//
// Capabilities.TTLFloor:
//
//   - TTLFloor is the smallest TTL the backend supports. — checked by TTLFloorIsAtMostTheTTL.
//
// Capabilities.ExpiryLatency:
//
//   - ExpiryLatency bounds how late after its deadline an expired key's delete reaches watchers (reads never return an expired key). — checked by ExpiryReachesWatchersWithinTheLatency.
//
// Capabilities.MaxValueSize:
//
//   - MaxValueSize is the largest value in bytes the store accepts; 0 means no cap. — checked by ValueCapIsReported.
//
// Capabilities.LinearizableFailover:
//
//   - LinearizableFailover reports whether compare-and-swap stays linearizable when a server fails over. — no rule: a claim about failovers; the store rules run on a healthy server (RunFailover and RunChaos fail servers, and check the coordinator's guarantees).
//   - When false, fencing holds on a single server only and is best effort across failovers. — no rule: it explains the claim above.
//
// Capabilities.Durability:
//
//   - Durability says, in words, what survives a server crash. — no rule: free text for people.
//
// Capabilities.RequiredSettings:
//
//   - RequiredSettings lists server settings the guarantees depend on. — no rule: free text for people.
//
// Capabilities.UnmetSettings:
//
//   - UnmetSettings lists the required settings the driver checked when the store was opened and found unmet, or could not verify, each with what the server has instead. — no rule: the suite cannot see a server's settings; each driver's own tests check what it reports (stores/redis TestPersistenceSettingsAreCheckedAtStartup).
//   - Empty means none found unmet (a driver that checks nothing reports none). — no rule: it defines the empty report, which RequiredSettingsAreMet accepts.
//   - The conformance suite fails a store that reports any. — checked by RequiredSettingsAreMet.
//
// Capabilities.UpdateAndDelete:
//
//   - UpdateAndDelete reports whether the store has the optional [spate.Releaser] capability. — checked by ReleaserIsReported.
//   - A store that reports it implements Releaser, and a store that implements Releaser without reporting it is used as one without. — checked by ReleaserIsReported.
//   - driver.NewStore sets it when its Driver implements Releaser, and a wrapper that does not pass the method on clears it. — checked by ReleaserIsReported.
//
// Capabilities.WatchKeys:
//
//   - WatchKeys reports whether the store has the optional [spate.KeyWatcher] capability, under the same rules as UpdateAndDelete: a store that reports it implements KeyWatcher, driver.NewStore sets it when its Driver implements KeyWatcher, and a wrapper that does not pass the method on clears it. — checked by KeyWatcherIsReported.
//
// Capabilities.Sessions:
//
//   - Sessions reports whether the store has the optional [spate.Sessioner] capability, under the same rules as UpdateAndDelete. — checked by SessionerIsReported.
//
// Releaser:
//
//   - Releaser is the optional capability of a store that updates a durable key and deletes an ephemeral key in one atomic call. — checked by ReleaseUpdatesAndDeletes, ReleaseIsSeenAtOnce.
//   - The coordinator hands a split back with it in one round trip (the owner cleared from the split's progress record, its lease deleted) and in two calls, Update then Delete, on a store without it. — no rule: the coordinator's use of it; the root's TestStoreCallsPerLifecycle and conformance.MeasureLifecycle (every driver's TestStoreCallsPerLifecycle) count the calls.
//   - Find it with [spate.ReleaserOf]. — no rule: a reference.
//
// Releaser.UpdateAndDelete:
//
//   - UpdateAndDelete updates durableKey in the [spate.Durable] keyspace as [spate.Store.Update] does and, only if that update wins, deletes ephemeralKey in the [spate.Ephemeral] keyspace if it exists at exactly leaseExpected, both in one atomic write. — checked by ReleaseUpdatesAndDeletes.
//   - A lost update writes nothing: both outcomes are Lost and the ephemeral key is left as it is. — checked by ReleaseLostUpdateWritesNothing.
//   - A delete that loses its guard does not undo the update: updated is Won and deleted Lost. — checked by ReleaseLostGuardKeepsTheUpdate.
//   - The outcomes' revisions are those [spate.Store.Update] and [spate.Store.Delete] would report for the two writes. — checked by ReleaseOutcomesCarryTheirRevisions.
//   - Both changes become visible at once: no read sees the delete without the update, and the watchers of each keyspace receive that keyspace's change in its revision order. — checked by ReleaseIsSeenAtOnce.
//   - A leaseExpected of [spate.AnyRevision] deletes nothing (no live key has it): the call is then a plain Update. — checked by ReleaseAtAnyRevisionIsAPlainUpdate.
//   - A call that fails Retryable landed both writes or neither, never one alone. — no rule: the suite cannot lose a reply between a driver and its server; ReleaseIsSeenAtOnce checks that the two writes are one.
//   - Its arguments, errors and Close are those of Update and Delete. — checked by ReleaseArgumentsAndCloseAreChecked.
//
// KeyMaxLen:
//
//   - KeyMaxLen is the maximum store key length in bytes. — checked by ValidKeysAreAccepted, InvalidKeysRejected.
//
// MaxWatchKeys:
//
//   - MaxWatchKeys is the most keys one [spate.KeyWatcher.WatchKeys] call watches. — checked by WatchKeysArgumentsAreChecked.
//
// KeyWatcher:
//
//   - KeyWatcher is the optional capability of a store that watches a set of exact keys, natively: the store sends a watcher the changes of its keys only, so what a watcher receives grows with the keys it watches, not with the writes to the whole keyspace. — checked by WatchKeysDeliversOnlyListedKeys.
//   - A coordinator on a store with it watches only the keys that concern it (so that a worker's work grows with its own splits); on a store without it, every worker watches the whole job. — no rule: it describes the coordinator, not a store; the root's TestANonLeaderWatchesOnlyItsOwnKeys checks it.
//   - Find it with [spate.KeyWatcherOf]. — no rule: a reference.
//
// KeyWatcher.WatchKeys:
//
//   - WatchKeys streams the changes of the keys listed, in keyspace ks: first a [spate.WatchPut] for every listed key that is live (the snapshot), then exactly one [spate.WatchSnapshotDone], then live puts and deletes of listed keys, expiry included. — checked by WatchKeysSnapshotHoldsTheLiveListedKeys, WatchKeysDeliversPutsDeletesAndExpiry.
//   - It never delivers an event of a key that is not listed. — checked by WatchKeysDeliversOnlyListedKeys.
//   - The rules of [spate.Store.Watch] hold for each listed key: no gaps (the watcher's view of the listed keys converges to the store's, across the boundary between snapshot and live stream too), duplicates allowed across that boundary, superseded revisions may be coalesced, the latest revision of every key is delivered, and one key's events arrive in revision order. — checked by WatchKeysHasNoGaps, WatchKeysDeliversPutsDeletesAndExpiry.
//   - Events of different keys may interleave in any order. — no rule: it permits; a driver cannot break it.
//   - keys holds 1 to [spate.MaxWatchKeys] valid keys; a key listed twice is watched once. — checked by WatchKeysWatchesARepeatedKeyOnce, WatchKeysArgumentsAreChecked.
//   - The stream ends, errors and Close are those of [spate.Store.Watch]. — checked by WatchKeysEndsLikeAWatch.
//
// Sessioner:
//
//   - Sessioner is the optional capability of a store whose ephemeral keys can share one lifetime, renewed by one call that writes no key: a worker holding N splits keeps their leases with one [spate.Session.KeepAlive] per beat instead of N updates, and no watcher receives a renewal. — checked by SessionKeysLiveWhileKeptAlive, KeepAliveWritesNothing.
//   - A coordinator on a store with it binds its split leases to a session; on a store without it, it rewrites each lease. — no rule: the coordinator's use of it.
//   - Find it with [spate.SessionerOf]. — no rule: a reference.
//
// Sessioner.NewSession:
//
//   - NewSession starts a session whose lifetime is the store's TTL ([spate.Capabilities.TTL]), counted from this call. — checked by ExpiredSessionFails.
//
// Session:
//
//   - Session is a lifetime that ephemeral keys share. — checked by SessionKeysLiveWhileKeptAlive.
//   - A key bound to a session lives as long as the session: until one TTL after the start of the session's last successful KeepAlive (or of NewSession), however recently the key was written; it then expires, and its expiry reaches watchers as a delete, as any ephemeral key's does. — checked by SessionKeysLiveWhileKeptAlive.
//   - Store.Update of a bound key (not Session.Update) unbinds it: it then expires one TTL after that write. — checked by StoreUpdateUnbinds.
//   - Store.Delete, Get, List and Watch treat bound keys as any ephemeral key. — checked by SessionKeysLiveWhileKeptAlive, KeepAliveWritesNothing, SessionCloseDeletesItsKeys.
//   - Its calls check their arguments and classify their errors as Store.Create and Store.Update do; the store's Close closes every open session, and after it every session call but Close fails with an error matching [spate.ErrClosed] and [spate.ErrFatal]. — checked by SessionArgumentsAndStoreClose.
//
// Session.Create:
//
//   - Create is [spate.Store.Create] in the [spate.Ephemeral] keyspace, the key bound to the session. — checked by SessionCreateAndUpdateAreFenced.
//
// Session.Update:
//
//   - Update is [spate.Store.Update] in the [spate.Ephemeral] keyspace, the key bound to the session (whatever it was bound to before). — checked by SessionCreateAndUpdateAreFenced.
//
// Session.KeepAlive:
//
//   - KeepAlive renews the session: when it returns nil, every key bound to it lives until at least one TTL after KeepAlive was called. — checked by SessionKeysLiveWhileKeptAlive.
//   - It writes no key: no watcher receives an event and no revision moves. — checked by KeepAliveWritesNothing.
//   - On a session that expired it returns an error matching [spate.ErrSessionExpired] and [spate.ErrFatal]. — checked by ExpiredSessionFails.
//
// Session.Close:
//
//   - Close ends the session: the keys bound to it are deleted, and watchers receive the deletes. — checked by SessionCloseDeletesItsKeys.
//   - It is idempotent; after it every other call fails with an error matching [spate.ErrClosed] and [spate.ErrFatal]. — checked by SessionCloseDeletesItsKeys.
//
// The error classes (errors.go):
//
//   - The error classes. — no rule: a heading.
//   - Every error spate returns satisfies errors.Is with exactly one of ErrFenced, ErrRetryable or ErrFatal. — checked by ErrorsAreRetryableOrFatal.
//   - Store drivers keep the backend's error and add the class: — checked by ErrorsKeepTheirCause.
//   - Never match error strings; use errors.Is, or [spate.IsRetryable], [spate.IsFenced] and [spate.IsFatal]. — no rule: it binds the caller.
//
// ErrFenced:
//
//   - ErrFenced: a fenced write lost, so this instance no longer owns the split and nothing was written. — no rule: the coordinator's error; that a store never returns it is the next sentence.
//   - Callers intercept it and treat the split as lost; it is never produced by a store. — checked by ErrorsAreRetryableOrFatal.
//
// ErrRetryable:
//
//   - ErrRetryable: a transient failure (timeout, transport error, broken or lagged watch, cancelled context). — checked by CancelledContextIsRetryable, LaggingWatcherConvergesOrBreaksRetryable.
//   - A write that fails Retryable MAY HAVE LANDED: the reply, not necessarily the write, was lost. — no rule: it permits; a driver cannot break it.
//   - Re-read before assuming either way. — no rule: it binds the caller.
//
// ErrFatal:
//
//   - ErrFatal: unrecoverable (misconfiguration, a store without the required atomic primitives, a corrupt or alien record, a diverging job fingerprint, an unsupported server version). — checked by InvalidKeyspacesAreFatal, InvalidKeysRejected, ValueSizeCap, UseAfterClose.
//   - The pipeline must stop. — no rule: it binds the caller.
//
// Their refinements (errors.go):
//
//   - Refinements of the classes above. — no rule: a heading.
//   - Each is returned wrapped together with its class, so errors.Is matches both. — checked by InvalidKeysRejected, ValueSizeCap, UseAfterClose.
//
// ErrClosed:
//
//   - ErrClosed is returned (with ErrFatal) by every call after Close but Close itself, which is idempotent. — checked by UseAfterClose, CloseEndsEveryWatchAndIsIdempotent.
//
// ErrValueTooLarge:
//
//   - ErrValueTooLarge is returned (with ErrFatal) by a store write whose value exceeds the store's reported cap; nothing was written. — checked by ValueSizeCap.
//
// ErrInvalidKey:
//
//   - ErrInvalidKey is returned (with ErrFatal) for a key or prefix outside the store key syntax; nothing was written. — checked by InvalidKeysRejected.
//
// ErrUnreadableRecord:
//
//   - ErrUnreadableRecord is returned (with ErrFatal) for a record of the job that cannot be read: corrupt bytes, an unknown schema, an id that does not match its key, or another job's fingerprint. — no rule: the coordinator's error about the job's records; a store never returns it (the coordinator rule DamagedRecordTakesOnlyItsSplitOutOfPlay checks what follows).
//   - A coordinator takes only the split it belongs to out of play. — no rule: a coordinator rule: DamagedRecordTakesOnlyItsSplitOutOfPlay.
//
// ErrSessionExpired:
//
//   - ErrSessionExpired is returned (with ErrFatal) by every call on a [spate.Session] that expired: no KeepAlive reached the store for a TTL, and the keys bound to it are gone. — checked by ExpiredSessionFails.
//   - Start a new session. — no rule: it binds the caller.
package conformance
