package spate

import (
	"context"
	"fmt"
	"time"
)

// Store is the contract every coordination store driver implements: six
// primitives over two keyspaces. The coordinator needs nothing else, and it
// trusts nothing else: fencing rests on Create and Update being linearizable
// compare-and-set operations.
//
// # Keyspaces
//
// [Durable] keys never expire. [Ephemeral] keys expire one fixed TTL after
// their last write (create or update), measured on the store's clock from no
// earlier than the start of the write call; the TTL is fixed when the store
// is opened and reported by [Capabilities.TTL]. A key expires at one instant
// between its deadline and [Capabilities.ExpiryLatency] after it, for every
// primitive alike: from then on it is absent to all of them, and watchers
// receive a [WatchDelete].
//
// # Revisions
//
// A revision is a store-assigned uint64, never 0 for a live key. It strictly
// increases per key across the key's whole history, including delete and
// re-create (a keyspace- or store-wide counter does this; a per-key version
// that restarts on re-create does not). Revisions are content-independent, so
// a compare-and-swap has no ABA problem. A delete has a revision too, greater
// than every revision the key held before, and watchers receive it.
//
// # Outcomes and errors
//
// Losing a condition is an outcome ([Outcome.Won] false), not an error.
// Every error satisfies errors.Is with [ErrRetryable] or [ErrFatal]:
//
//   - Retryable: timeouts, transport failures, a cancelled or expired
//     context, a broken or lagged watch. A write that fails Retryable may
//     have landed; the caller re-reads to find out.
//   - Fatal: misconfiguration, unsupported server, authentication failure,
//     a keyspace other than [Durable] and [Ephemeral], a value over the
//     size cap ([ErrValueTooLarge]), an invalid key ([ErrInvalidKey]), use
//     after Close ([ErrClosed]). Nothing was written.
//
// Drivers make one attempt per call; retries live in the coordinator.
// A driver that must make an exception for correctness says so, and why,
// in its package documentation.
//
// # Keys and values
//
// Keys are 1–256 bytes of [A-Za-z0-9_.-] that neither start nor end with
// '.' and hold no "..". A prefix is empty or a key prefix that may end with
// '.'. See [ValidateKey].
//
// A value is any byte string up to [Capabilities.MaxValueSize] bytes; Get,
// List and Watch return it byte for byte. The empty value is a value like
// any other: its key is live.
//
// # Concurrency and Close
//
// Every method is safe for concurrent use. Close releases what the driver
// started (never a client the caller passed in), ends every open watch (its
// channel closes) and is idempotent. After Close every method returns an
// error matching both [ErrClosed] and [ErrFatal]. A call in flight when
// Close begins has its context cancelled, and Close waits for it to return
// before it closes the backend, so that no call reaches a backend after
// Close.
//
// # Drivers
//
// Every driver is a [github.com/spate-go/spate/driver.Driver] wrapped by
// driver.NewStore, whose PortableStore holds, once for all drivers, the
// closed state, the tracking of calls in flight, the argument checks, the
// value cap, the revision-0 rule of Update and the error format
// (driver.OpError); the driver does the backend's part and classifies its
// own errors.
type Store interface {
	// Capabilities reports what the driver promises. It never blocks.
	Capabilities() Capabilities

	// Create writes key if it is absent (deleted and expired keys are
	// absent) and returns Won with the new revision; if the key exists it
	// returns Lost and writes nothing.
	Create(ctx context.Context, ks Keyspace, key string, value []byte) (Outcome, error)

	// Update writes key only if it currently exists at exactly revision
	// expected, returning Won with a strictly larger revision; otherwise Lost.
	// expected must be a revision read from a live value (a create, update,
	// get, listing or put event); an Update at the revision of a delete is
	// undefined (some stores cannot tell a delete marker from a value).
	// On the ephemeral keyspace a won Update re-arms the key's TTL: it is
	// the heartbeat.
	Update(ctx context.Context, ks Keyspace, key string, value []byte, expected uint64) (Outcome, error)

	// Get reads key. ok is false for an absent key; a deleted or expired key
	// is absent, never a tombstone.
	Get(ctx context.Context, ks Keyspace, key string) (e Entry, ok bool, err error)

	// Delete removes key. With expected == [AnyRevision] it is unconditional
	// and wins even when the key is absent. Otherwise it is guarded: it wins
	// only if the key exists at exactly expected, and a guarded delete of an
	// absent key loses. Outcome.Revision is the delete's revision when the
	// backend reports one, else 0.
	Delete(ctx context.Context, ks Keyspace, key string, expected uint64) (Outcome, error)

	// Watch streams changes under prefix: first a [WatchPut] for every live
	// key (the snapshot), then exactly one [WatchSnapshotDone], then live
	// puts and deletes, expiry included. There are no gaps: the watcher's
	// view always converges to the store's state, across the boundary
	// between snapshot and live stream too. Duplicates across that boundary
	// are allowed (consumers de-duplicate by revision), and a revision of a
	// key superseded before it was delivered may be coalesced into the
	// later one (a store that keeps one version per key cannot replay it);
	// the latest revision of every key is always delivered. Events of one
	// key arrive in revision order.
	//
	// The stream ends, and the channel closes, when ctx is cancelled, the
	// store is closed, or the stream breaks. A broken stream delivers a
	// [WatchError] as its last event: Retryable for a transient break (a
	// dropped connection, a compacted history, a watcher too slow to keep
	// up), after which the consumer re-watches; Fatal when the stream can
	// never resume (permission revoked, corrupt data). An error
	// establishing the watch, including a cancelled ctx, is returned
	// directly.
	Watch(ctx context.Context, ks Keyspace, prefix string) (<-chan WatchEvent, error)

	// List returns every live key under prefix with value and revision,
	// sorted by key. It never under-reports a key that was live for the
	// whole call: the coordinator treats absence from a listing as a delete.
	List(ctx context.Context, ks Keyspace, prefix string) ([]Entry, error)

	// Close releases the driver's resources; see the type documentation.
	Close() error
}

// Keyspace selects one of the store's two keyspaces.
type Keyspace uint8

const (
	// Durable keys never expire.
	Durable Keyspace = iota + 1
	// Ephemeral keys expire one TTL after their last write.
	Ephemeral
)

func (k Keyspace) String() string {
	switch k {
	case Durable:
		return "durable"
	case Ephemeral:
		return "ephemeral"
	}
	return fmt.Sprintf("Keyspace(%d)", uint8(k))
}

// AnyRevision as the expected revision of [Store.Delete] makes the delete
// unconditional.
const AnyRevision uint64 = 0

// Outcome is the result of a conditional write. The zero Outcome is Lost.
type Outcome struct {
	// Won reports whether the write applied.
	Won bool
	// Revision is the revision the write minted (0 when lost, and for a
	// delete whose backend does not report one).
	Revision uint64
}

// Won returns a winning outcome at rev.
func Won(rev uint64) Outcome { return Outcome{Won: true, Revision: rev} }

// Entry is one live key.
type Entry struct {
	Key      string
	Value    []byte
	Revision uint64
}

// WatchEventKind tells the watch events apart.
type WatchEventKind uint8

const (
	// WatchPut: Key was written at Revision with Value.
	WatchPut WatchEventKind = iota + 1
	// WatchDelete: Key was deleted or expired at Revision.
	WatchDelete
	// WatchSnapshotDone: every key live when the watch began has been
	// delivered.
	WatchSnapshotDone
	// WatchError: the stream broke; Err says why. It is the last event.
	WatchError
)

func (k WatchEventKind) String() string {
	switch k {
	case WatchPut:
		return "put"
	case WatchDelete:
		return "delete"
	case WatchSnapshotDone:
		return "snapshot-done"
	case WatchError:
		return "error"
	}
	return fmt.Sprintf("WatchEventKind(%d)", uint8(k))
}

// WatchEvent is one item of a watch stream.
type WatchEvent struct {
	Kind     WatchEventKind
	Key      string
	Value    []byte
	Revision uint64
	Err      error
}

// Capabilities is what a driver reports about itself.
type Capabilities struct {
	// Driver names the backend ("mem", "etcd", "redis", "nats").
	Driver string
	// TTL is the ephemeral keyspace's TTL, fixed when the store was opened.
	TTL time.Duration
	// TTLFloor is the smallest TTL the backend supports.
	TTLFloor time.Duration
	// ExpiryLatency bounds how late after its deadline an expired key's
	// delete reaches watchers (reads never return an expired key).
	ExpiryLatency time.Duration
	// MaxValueSize is the largest value in bytes the store accepts; 0 means
	// no cap.
	MaxValueSize int
	// LinearizableFailover reports whether compare-and-swap stays
	// linearizable when a server fails over. When false, fencing holds on a
	// single server only and is best effort across failovers.
	LinearizableFailover bool
	// Durability says, in words, what survives a server crash.
	Durability string
	// RequiredSettings lists server settings the guarantees depend on.
	RequiredSettings []string
	// UnmetSettings lists the required settings the driver checked when
	// the store was opened and found unmet, or could not verify, each with
	// what the server has instead. Empty means none found unmet (a driver
	// that checks nothing reports none). The conformance suite fails a
	// store that reports any.
	UnmetSettings []string
	// UpdateAndDelete reports whether the store has the optional
	// [Releaser] capability. A store that reports it implements Releaser,
	// and a store that implements Releaser without reporting it is used
	// as one without. driver.NewStore sets it when its Driver implements
	// Releaser, and a wrapper that does not pass the method on clears it.
	UpdateAndDelete bool
	// WatchKeys reports whether the store has the optional [KeyWatcher]
	// capability, under the same rules as UpdateAndDelete: a store that
	// reports it implements KeyWatcher, driver.NewStore sets it when its
	// Driver implements KeyWatcher, and a wrapper that does not pass the
	// method on clears it.
	WatchKeys bool
	// Sessions reports whether the store has the optional [Sessioner]
	// capability, under the same rules as UpdateAndDelete.
	Sessions bool
}

// Releaser is the optional capability of a store that updates a durable key
// and deletes an ephemeral key in one atomic call. The coordinator hands a
// split back with it in one round trip (the owner cleared from the split's
// progress record, its lease deleted) and in two calls, Update then Delete,
// on a store without it. Find it with [ReleaserOf].
type Releaser interface {
	// UpdateAndDelete updates durableKey in the [Durable] keyspace as
	// [Store.Update] does and, only if that update wins, deletes
	// ephemeralKey in the [Ephemeral] keyspace if it exists at exactly
	// leaseExpected, both in one atomic write.
	// A lost update writes nothing: both outcomes are Lost and the
	// ephemeral key is left as it is.
	// A delete that loses its guard does not undo the update: updated is
	// Won and deleted Lost.
	// The outcomes' revisions are those [Store.Update] and [Store.Delete]
	// would report for the two writes.
	// Both changes become visible at once: no read sees the delete
	// without the update, and the watchers of each keyspace receive that
	// keyspace's change in its revision order.
	// A leaseExpected of [AnyRevision] deletes nothing (no live key has
	// it): the call is then a plain Update.
	// A call that fails Retryable landed both writes or neither, never one
	// alone.
	// Its arguments, errors and Close are those of Update and Delete.
	UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
		ephemeralKey string, leaseExpected uint64) (updated, deleted Outcome, err error)
}

// ReleaserOf returns st as a [Releaser] if st has the capability: it
// implements the interface and reports [Capabilities.UpdateAndDelete].
func ReleaserOf(st Store) (Releaser, bool) {
	r, ok := st.(Releaser)
	if !ok || !st.Capabilities().UpdateAndDelete {
		return nil, false
	}
	return r, true
}

// KeyMaxLen is the maximum store key length in bytes.
const KeyMaxLen = 256

// ValidateKey reports whether key is a valid store key; the error matches
// [ErrInvalidKey] and [ErrFatal].
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("key is empty: %w: %w", ErrInvalidKey, ErrFatal)
	}
	return validateKeyish("key", key, false)
}

// ValidatePrefix reports whether prefix is a valid watch or list prefix: empty,
// or a key that may end with '.'.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return validateKeyish("prefix", prefix, true)
}

func validateKeyish(what, s string, trailingDot bool) error {
	bad := func(why string) error {
		return fmt.Errorf("%s %q %s: %w: %w", what, s, why, ErrInvalidKey, ErrFatal)
	}
	if len(s) > KeyMaxLen {
		return bad(fmt.Sprintf("is longer than %d bytes", KeyMaxLen))
	}
	if s[0] == '.' {
		return bad("starts with '.'")
	}
	if !trailingDot && s[len(s)-1] == '.' {
		return bad("ends with '.'")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '.' {
			if i > 0 && s[i-1] == '.' {
				return bad(`holds ".."`)
			}
			continue
		}
		if !identByte(c) {
			return bad(fmt.Sprintf("holds %q outside [A-Za-z0-9_.-]", c))
		}
	}
	return nil
}

// contextError classifies a context failure as Retryable, keeping the
// context's own error for errors.Is(err, context.Canceled); nil when ctx
// is live. (Drivers have driver.ContextError.)
func contextError(ctx context.Context, who, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %s: %w: %w", who, op, err, ErrRetryable)
	}
	return nil
}

// MaxWatchKeys is the most keys one [KeyWatcher.WatchKeys] call watches.
const MaxWatchKeys = 1024

// KeyWatcher is the optional capability of a store that watches a set of
// exact keys, natively: the store sends a watcher the changes of its keys
// only, so what a watcher receives grows with the keys it watches, not with
// the writes to the whole keyspace. A coordinator on a store with it
// watches only the keys that concern it (so that a worker's work grows with
// its own splits); on a store without it, every worker watches the whole
// job. Find it with [KeyWatcherOf].
type KeyWatcher interface {
	// WatchKeys streams the changes of the keys listed, in keyspace ks:
	// first a [WatchPut] for every listed key that is live (the snapshot),
	// then exactly one [WatchSnapshotDone], then live puts and deletes of
	// listed keys, expiry included.
	// It never delivers an event of a key that is not listed.
	// The rules of [Store.Watch] hold for each listed key: no gaps (the
	// watcher's view of the listed keys converges to the store's, across
	// the boundary between snapshot and live stream too), duplicates
	// allowed across that boundary, superseded revisions may be coalesced,
	// the latest revision of every key is delivered, and one key's events
	// arrive in revision order. Events of different keys may interleave in
	// any order.
	// keys holds 1 to [MaxWatchKeys] valid keys; a key listed twice is
	// watched once.
	// The stream ends, errors and Close are those of [Store.Watch].
	WatchKeys(ctx context.Context, ks Keyspace, keys []string) (<-chan WatchEvent, error)
}

// KeyWatcherOf returns st as a [KeyWatcher] if st has the capability: it
// implements the interface and reports [Capabilities.WatchKeys].
func KeyWatcherOf(st Store) (KeyWatcher, bool) {
	w, ok := st.(KeyWatcher)
	if !ok || !st.Capabilities().WatchKeys {
		return nil, false
	}
	return w, true
}

// Sessioner is the optional capability of a store whose ephemeral keys can
// share one lifetime, renewed by one call that writes no key: a worker
// holding N splits keeps their leases with one [Session.KeepAlive] per
// beat instead of N updates, and no watcher receives a renewal. A
// coordinator on a store with it binds its split leases to a session; on
// a store without it, it rewrites each lease. Find it with [SessionerOf].
type Sessioner interface {
	// NewSession starts a session whose lifetime is the store's TTL
	// ([Capabilities.TTL]), counted from this call.
	NewSession(ctx context.Context) (Session, error)
}

// Session is a lifetime that ephemeral keys share. A key bound to a
// session lives as long as the session: until one TTL after the start of
// the session's last successful KeepAlive (or of NewSession), however
// recently the key was written; it then expires, and its expiry reaches
// watchers as a delete, as any ephemeral key's does. Store.Update of a
// bound key (not Session.Update) unbinds it: it then expires one TTL
// after that write. Store.Delete, Get, List and Watch treat bound keys as
// any ephemeral key. Its calls check their arguments and classify their
// errors as Store.Create and Store.Update do; the store's Close closes
// every open session, and after it every session call but Close fails
// with an error matching [ErrClosed] and [ErrFatal].
type Session interface {
	// Create is [Store.Create] in the [Ephemeral] keyspace, the key bound
	// to the session.
	Create(ctx context.Context, key string, value []byte) (Outcome, error)
	// Update is [Store.Update] in the [Ephemeral] keyspace, the key bound
	// to the session (whatever it was bound to before).
	Update(ctx context.Context, key string, value []byte, expected uint64) (Outcome, error)
	// KeepAlive renews the session: when it returns nil, every key bound
	// to it lives until at least one TTL after KeepAlive was called. It
	// writes no key: no watcher receives an event and no revision moves.
	// On a session that expired it returns an error matching
	// [ErrSessionExpired] and [ErrFatal].
	KeepAlive(ctx context.Context) error
	// Close ends the session: the keys bound to it are deleted, and
	// watchers receive the deletes. It is idempotent; after it every
	// other call fails with an error matching [ErrClosed] and [ErrFatal].
	Close() error
}

// SessionerOf returns st as a [Sessioner] if st has the capability: it
// implements the interface and reports [Capabilities.Sessions].
func SessionerOf(st Store) (Sessioner, bool) {
	s, ok := st.(Sessioner)
	if !ok || !st.Capabilities().Sessions {
		return nil, false
	}
	return s, true
}
