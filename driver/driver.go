package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/spate-go/spate"
)

// Driver is the backend half of a store: what a driver package implements
// and [NewStore] turns into a [spate.Store] (as Go CDK's blob.Bucket wraps a
// driver.Bucket). The portable layer does everything the six primitives
// share, once, so a Driver does only the backend's part:
//
//   - it is never called after Close has begun, and Close is called exactly
//     once, after every other call has returned;
//   - every call has a valid keyspace and a valid key ([spate.ValidateKey]; a
//     valid prefix, [spate.ValidatePrefix], for Watch and List), a context that
//     was live when the call began, and, for Create and Update, a value
//     within [spate.Capabilities.MaxValueSize];
//   - Update is never called with expected revision 0 (no live key has it;
//     the layer answers spate.Lost);
//   - a call's context, and the context a watch's stream runs on, is
//     cancelled when Close begins (its cause matches [spate.ErrClosed]), so a
//     driver need not track its calls to end them.
//
// A driver's own methods that touch the driver run under
// [PortableStore.Do], which holds them to the same rule.
//
// Capabilities is called once, by [NewStore]: the store reports that
// snapshot for its lifetime.
//
// A Driver classifies its own errors: each error it returns, and each
// [spate.WatchError] it sends, wraps [spate.ErrRetryable] or [spate.ErrFatal] (see [spate.Store]
// for which). The layer adds the driver, the operation, the keyspace and
// the key in front of a returned error ([OpError]), so a driver's message
// starts with what went wrong, not with its own name; a returned error the
// driver left unclassified is Fatal (a bare context error: Retryable), as
// [spate.IsFatal] says. A spate.WatchError reaches the caller as the driver sent it, so the driver formats it with
// [OpError] itself. A Driver makes one attempt per call: retries live in
// the coordinator.
//
// Close releases what the driver started and ends its watches; the layer
// calls it once, so it need not be idempotent.
//
// A Driver may also implement [spate.Releaser]; the layer then reports
// [spate.Capabilities.UpdateAndDelete] and passes the call on under the same
// rules: both keys valid, the value within the cap, and neither expected
// nor leaseExpected ever 0 (the layer answers both spate.Lost for the first and
// makes the call a plain Update for the second).
//
// A Driver may also implement [spate.KeyWatcher]; the layer then reports
// [spate.Capabilities.WatchKeys] and passes the call on with 1 to
// [spate.MaxWatchKeys] valid keys, sorted, each listed once.
//
// A Driver may also implement [spate.Sessioner]; the layer then reports
// [spate.Capabilities.Sessions] and wraps each driver [spate.Session] under the same
// rules: its Create and Update get a valid key, a value within the cap, a
// live context that Close cancels, and never an expected revision of 0;
// no call reaches a session after it reported [spate.ErrSessionExpired]; and the
// layer calls each session's Close exactly once, after every call on the
// session has returned (those in flight have their context cancelled) and
// at the latest when the store closes, before the driver's Close.
type Driver interface {
	Capabilities() spate.Capabilities
	Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error)
	Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error)
	Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error)
	Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error)
	Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error)
	List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error)
	Close() error
}

// PortableStore is the [spate.Store] over a [Driver]: closed state, argument
// checks, the value cap, the revision-0 rule and the error format live
// here, once, for every driver. Driver packages return it embedded in
// their own spate.Store type, which adds the driver's own methods.
//
// It tracks the calls in flight: Close refuses new calls, cancels the
// context of those in flight (and of every watch), waits for them to
// return, and only then closes the driver, so no call reaches a driver
// after Close.
type PortableStore struct {
	d    Driver
	caps spate.Capabilities

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // calls in flight; Add only under mu while open
	// live holds the cancel of every call in flight and every open
	// watch, by a number of its own; Close cancels them with cause
	// errClosing.
	live map[uint64]context.CancelCauseFunc
	next uint64
	// sessions holds the open sessions; Close closes them before the
	// driver.
	sessions map[*portableSession]struct{}

	closeOnce sync.Once
	closeErr  error
}

var _ spate.Store = (*PortableStore)(nil)

// NewStore wraps d into a [spate.Store]. It calls d.Capabilities once.
func NewStore(d Driver) *PortableStore {
	caps := d.Capabilities()
	_, caps.UpdateAndDelete = d.(spate.Releaser)
	_, caps.WatchKeys = d.(spate.KeyWatcher)
	_, caps.Sessions = d.(spate.Sessioner)
	return &PortableStore{d: d, caps: caps, live: map[uint64]context.CancelCauseFunc{}}
}

var (
	_ spate.Releaser   = (*PortableStore)(nil)
	_ spate.KeyWatcher = (*PortableStore)(nil)
	_ spate.Sessioner  = (*PortableStore)(nil)
)

// OpError is the one format of a store operation's error:
//
//	<driver>: <op> <keyspace> "<key>": <err>
//
// [PortableStore] puts it in front of every error it returns; drivers use
// it for the [spate.WatchError] events they send, which reach the caller as
// they are. err keeps its class.
func OpError(driver, op string, ks spate.Keyspace, key string, err error) error {
	return fmt.Errorf("%s: %s %s %q: %w", driver, op, ks, key, err)
}

var (
	// errClosed is the error of a call made after Close began.
	errClosed = fmt.Errorf("store is closed: %w: %w", spate.ErrClosed, spate.ErrFatal)
	// errClosing is the cause of the context of a call in flight when
	// Close began. It carries no class: the call may have landed a write,
	// so the driver's error for it stays Retryable.
	errClosing = fmt.Errorf("the store was closed while the call was in flight: %w", spate.ErrClosed)
)

// Capabilities implements [spate.Store]: the driver's, as reported when the
// store was made (each caller gets its own copy of the lists).
func (p *PortableStore) Capabilities() spate.Capabilities {
	c := p.caps
	c.RequiredSettings = slices.Clone(c.RequiredSettings)
	c.UnmetSettings = slices.Clone(c.UnmetSettings)
	return c
}

// Do runs f as a call of the store: after Close it returns the closed error
// for op without running f, and Close waits for f to return. Driver
// packages use it for their own methods that touch the driver.
func (p *PortableStore) Do(op string, f func() error) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("%s: %s: %w", p.caps.Driver, op, errClosed)
	}
	p.calls.Add(1)
	p.mu.Unlock()
	defer p.calls.Done()
	return f()
}

// begin runs the checks every call shares and admits the call: the store
// is open (that error comes first), the keyspace is one of the two, the
// key (or prefix) is valid, a written value is within the cap, and ctx is
// live. Bad arguments are Fatal, a dead ctx Retryable. On success it
// returns the call's context, which Close cancels, and the hold that
// p.end releases.
func (p *PortableStore) begin(ctx context.Context, op string, ks spate.Keyspace, key string, isPrefix bool, value []byte, write bool) (context.Context, hold, error) {
	var err error
	switch {
	case ks != spate.Durable && ks != spate.Ephemeral:
		err = fmt.Errorf("invalid keyspace: %w", spate.ErrFatal)
	case isPrefix:
		err = spate.ValidatePrefix(key)
	default:
		err = spate.ValidateKey(key)
	}
	if err == nil && write {
		err = validateValue(value, p.caps.MaxValueSize)
	}
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", ctx.Err(), spate.ErrRetryable)
	}
	var (
		cctx context.Context
		h    hold
	)
	if err == nil {
		cctx, h.cancel = context.WithCancelCause(ctx)
	}
	p.mu.Lock()
	if p.closed {
		err = errClosed
	} else if err == nil {
		p.calls.Add(1)
		p.next++
		h.id = p.next
		p.live[h.id] = h.cancel
	}
	p.mu.Unlock()
	if err != nil {
		if h.cancel != nil {
			h.cancel(nil)
		}
		return nil, hold{}, OpError(p.caps.Driver, op, ks, key, err)
	}
	return cctx, h, nil
}

// hold is a call's (or a watch's) place among the live ones.
type hold struct {
	id     uint64
	cancel context.CancelCauseFunc
}

// end releases a call's hold; with done it also ends the call.
func (p *PortableStore) end(h hold, done bool) {
	p.mu.Lock()
	delete(p.live, h.id)
	p.mu.Unlock()
	h.cancel(nil)
	if done {
		p.calls.Done()
	}
}

// fail formats a driver's error and makes sure it carries a class.
func (p *PortableStore) fail(op string, ks spate.Keyspace, key string, err error) error {
	return OpError(p.caps.Driver, op, ks, key, classified(err))
}

// classified returns err with a class: its own, or the one spate gives an
// unclassified error (Retryable for a bare context error, else Fatal).
func classified(err error) error {
	if errors.Is(err, spate.ErrRetryable) || errors.Is(err, spate.ErrFatal) {
		return err
	}
	if spate.IsRetryable(err) {
		return fmt.Errorf("%w: %w", err, spate.ErrRetryable)
	}
	return fmt.Errorf("%w: %w", err, spate.ErrFatal)
}

// Create implements [spate.Store].
func (p *PortableStore) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	ctx, h, err := p.begin(ctx, "create", ks, key, false, value, true)
	if err != nil {
		return spate.Outcome{}, err
	}
	defer p.end(h, true)
	o, err := p.d.Create(ctx, ks, key, value)
	if err != nil {
		return spate.Outcome{}, p.fail("create", ks, key, err)
	}
	return o, nil
}

// Update implements [spate.Store]. An expected revision of 0 loses at once: no
// live key has it.
func (p *PortableStore) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	ctx, h, err := p.begin(ctx, "update", ks, key, false, value, true)
	if err != nil {
		return spate.Outcome{}, err
	}
	defer p.end(h, true)
	if expected == 0 {
		return spate.Outcome{}, nil
	}
	o, err := p.d.Update(ctx, ks, key, value, expected)
	if err != nil {
		return spate.Outcome{}, p.fail("update", ks, key, err)
	}
	return o, nil
}

// Get implements [spate.Store].
func (p *PortableStore) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	ctx, h, err := p.begin(ctx, "get", ks, key, false, nil, false)
	if err != nil {
		return spate.Entry{}, false, err
	}
	defer p.end(h, true)
	e, ok, err := p.d.Get(ctx, ks, key)
	if err != nil {
		return spate.Entry{}, false, p.fail("get", ks, key, err)
	}
	return e, ok, nil
}

// Delete implements [spate.Store].
func (p *PortableStore) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	ctx, h, err := p.begin(ctx, "delete", ks, key, false, nil, false)
	if err != nil {
		return spate.Outcome{}, err
	}
	defer p.end(h, true)
	o, err := p.d.Delete(ctx, ks, key, expected)
	if err != nil {
		return spate.Outcome{}, p.fail("delete", ks, key, err)
	}
	return o, nil
}

// opUpdateAndDelete names [PortableStore.UpdateAndDelete] in errors.
const opUpdateAndDelete = "update-and-delete"

// UpdateAndDelete implements [spate.Releaser] when the driver does (see
// [spate.Capabilities.UpdateAndDelete]); on a driver without it, it returns a
// Fatal error and writes nothing. An expected revision of 0 loses both at
// once, and a leaseExpected of 0 makes the call a plain Update. Errors
// name the durable key, or the ephemeral key when it is the invalid one.
func (p *PortableStore) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	ctx, h, err := p.begin(ctx, opUpdateAndDelete, spate.Durable, durableKey, false, value, true)
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, err
	}
	defer p.end(h, true)
	if err := spate.ValidateKey(ephemeralKey); err != nil {
		return spate.Outcome{}, spate.Outcome{}, OpError(p.caps.Driver, opUpdateAndDelete, spate.Ephemeral, ephemeralKey, err)
	}
	r, ok := p.d.(spate.Releaser)
	if !ok {
		return spate.Outcome{}, spate.Outcome{}, OpError(p.caps.Driver, opUpdateAndDelete, spate.Durable, durableKey,
			fmt.Errorf("the driver cannot update and delete in one call (spate.Capabilities.UpdateAndDelete is false): %w", spate.ErrFatal))
	}
	if expected == 0 {
		return spate.Outcome{}, spate.Outcome{}, nil
	}
	var u, d spate.Outcome
	if leaseExpected == spate.AnyRevision {
		u, err = p.d.Update(ctx, spate.Durable, durableKey, value, expected)
	} else {
		u, d, err = r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
	}
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, p.fail(opUpdateAndDelete, spate.Durable, durableKey, err)
	}
	return u, d, nil
}

// List implements [spate.Store].
func (p *PortableStore) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	ctx, h, err := p.begin(ctx, "list", ks, prefix, true, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.end(h, true)
	es, err := p.d.List(ctx, ks, prefix)
	if err != nil {
		return nil, p.fail("list", ks, prefix, err)
	}
	return es, nil
}

// Watch implements [spate.Store]. The driver's stream gets a context that ends
// with ctx or when Close begins, and goes to the caller as the driver sends
// it (no forwarding hop that would hold an event back).
func (p *PortableStore) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	wctx, h, err := p.begin(ctx, "watch", ks, prefix, true, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.calls.Done()
	ch, err := p.d.Watch(wctx, ks, prefix)
	if err != nil {
		p.end(h, false)
		return nil, p.fail("watch", ks, prefix, err)
	}
	// The stream keeps its hold, so that Close cancels it, until ctx ends.
	context.AfterFunc(wctx, func() { p.end(h, false) })
	return ch, nil
}

// opWatchKeys names [PortableStore.WatchKeys] in errors.
const opWatchKeys = "watch-keys"

// WatchKeys implements [spate.KeyWatcher] when the driver does (see
// [spate.Capabilities.WatchKeys]); on a driver without it, it returns a Fatal
// error. The keys reach the driver sorted and de-duplicated; an error names
// the first key listed (or the one at fault).
func (p *PortableStore) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	label := ""
	if len(keys) > 0 {
		label = keys[0]
	}
	var bad error
	switch {
	case len(keys) == 0:
		bad = fmt.Errorf("no keys to watch: %w", spate.ErrFatal)
	case len(keys) > spate.MaxWatchKeys:
		bad = fmt.Errorf("%d keys to watch, more than spate.MaxWatchKeys (%d): %w", len(keys), spate.MaxWatchKeys, spate.ErrFatal)
	}
	for _, k := range keys {
		if bad != nil {
			break
		}
		if err := spate.ValidateKey(k); err != nil {
			label, bad = k, err
		}
	}
	if bad != nil {
		return nil, OpError(p.caps.Driver, opWatchKeys, ks, label, bad)
	}
	kw, ok := p.d.(spate.KeyWatcher)
	if !ok {
		return nil, OpError(p.caps.Driver, opWatchKeys, ks, label,
			fmt.Errorf("the driver cannot watch a set of keys (spate.Capabilities.WatchKeys is false): %w", spate.ErrFatal))
	}
	set := slices.Compact(slices.Sorted(slices.Values(keys)))
	wctx, h, err := p.begin(ctx, opWatchKeys, ks, label, false, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.calls.Done()
	ch, err := kw.WatchKeys(wctx, ks, set)
	if err != nil {
		p.end(h, false)
		return nil, p.fail(opWatchKeys, ks, label, err)
	}
	context.AfterFunc(wctx, func() { p.end(h, false) })
	return ch, nil
}

// Close implements [spate.Store]: it refuses new calls, cancels the calls in
// flight and every watch's context, waits for the calls to return, then
// closes the driver, once. Later calls return what the first returned.
func (p *PortableStore) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		live := p.live
		p.live = nil
		p.mu.Unlock()
		for _, cancel := range live {
			cancel(errClosing)
		}
		p.calls.Wait()
		p.mu.Lock()
		sessions := p.sessions
		p.sessions = nil
		p.mu.Unlock()
		var errs []error
		for ps := range sessions {
			errs = append(errs, ps.closeDriver())
		}
		if err := p.d.Close(); err != nil {
			errs = append([]error{err}, errs...)
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// The operations of a [spate.Session], as errors name them.
const (
	opSessionNew    = "session-new"
	opSessionCreate = "session-create"
	opSessionUpdate = "session-update"
	opKeepAlive     = "keep-alive"
	opSessionClose  = "session-close"
)

// NewSession implements [spate.Sessioner] when the driver does (see
// [spate.Capabilities.Sessions]); on a driver without it, it returns a Fatal
// error. The spate.Session it returns applies the store's checks to every call
// (valid key, value cap, the revision-0 rule, a live context, the store's
// closed state) and formats its errors with [OpError], naming the
// [spate.Ephemeral] keyspace and the key ("" for the session's own calls). The
// store's Close closes every open session, and after it every session
// call fails with [spate.ErrClosed] and [spate.ErrFatal].
func (p *PortableStore) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := p.d.(spate.Sessioner)
	if !ok {
		return nil, OpError(p.caps.Driver, opSessionNew, spate.Ephemeral, "",
			fmt.Errorf("the driver has no sessions (spate.Capabilities.Sessions is false): %w", spate.ErrFatal))
	}
	ctx, h, err := p.begin(ctx, opSessionNew, spate.Ephemeral, "", true, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.end(h, true)
	ds, err := sr.NewSession(ctx)
	if err != nil {
		return nil, p.fail(opSessionNew, spate.Ephemeral, "", err)
	}
	ps := &portableSession{p: p, ds: ds}
	p.mu.Lock()
	if p.closed {
		// Close began while the session was being made: it will not see
		// this one, so end it here (Close waits for this call first).
		p.mu.Unlock()
		_ = ps.closeDriver()
		return nil, OpError(p.caps.Driver, opSessionNew, spate.Ephemeral, "", errClosed)
	}
	if p.sessions == nil {
		p.sessions = map[*portableSession]struct{}{}
	}
	p.sessions[ps] = struct{}{}
	p.mu.Unlock()
	return ps, nil
}

// portableSession is the [spate.Session] of a [PortableStore] over a driver's.
type portableSession struct {
	p  *PortableStore
	ds spate.Session

	mu      sync.Mutex
	closed  bool  // Close began (or the store's Close closed it)
	expired error // the driver's spate.ErrSessionExpired, once reported
	// live holds the cancel of each of the session's calls in flight;
	// calls counts them. Close cancels them and waits, so no call is in
	// the driver's session when its Close runs.
	live  map[uint64]context.CancelCauseFunc
	calls sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var (
	// errSessionClosed is the error of a call on a closed session.
	errSessionClosed = fmt.Errorf("session is closed: %w: %w", spate.ErrClosed, spate.ErrFatal)
	// errSessionClosing is the cause of the context of a session call in
	// flight when the session's Close began; like errClosing it carries
	// no class.
	errSessionClosing = fmt.Errorf("the session was closed while the call was in flight: %w", spate.ErrClosed)
)

// closeDriver closes the driver's session, once: it refuses new calls,
// cancels those in flight, waits for them, then closes.
func (s *portableSession) closeDriver() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		live := s.live
		s.live = nil
		s.mu.Unlock()
		for _, cancel := range live {
			cancel(errSessionClosing)
		}
		s.calls.Wait()
		s.closeErr = s.ds.Close()
	})
	return s.closeErr
}

// begin admits one session call: the store's checks first, then the
// session's own state.
func (s *portableSession) begin(ctx context.Context, op, key string, value []byte, write bool) (context.Context, hold, error) {
	p := s.p
	var (
		cctx context.Context
		h    hold
		err  error
	)
	if write {
		cctx, h, err = p.begin(ctx, op, spate.Ephemeral, key, false, value, true)
	} else {
		cctx, h, err = p.begin(ctx, op, spate.Ephemeral, "", true, nil, false)
	}
	if err != nil {
		return nil, hold{}, err
	}
	s.mu.Lock()
	switch {
	case s.closed:
		err = errSessionClosed
	case s.expired != nil:
		err = s.expired
	default:
		if s.live == nil {
			s.live = map[uint64]context.CancelCauseFunc{}
		}
		s.live[h.id] = h.cancel
		s.calls.Add(1)
	}
	s.mu.Unlock()
	if err != nil {
		p.end(h, true)
		return nil, hold{}, OpError(p.caps.Driver, op, spate.Ephemeral, key, err)
	}
	return cctx, h, nil
}

// end releases a session call's hold, in the session and in the store.
func (s *portableSession) end(h hold) {
	s.mu.Lock()
	delete(s.live, h.id)
	s.mu.Unlock()
	s.calls.Done()
	s.p.end(h, true)
}

// failed formats a driver session's error, remembering an expiry.
func (s *portableSession) failed(op, key string, err error) error {
	err = classified(err)
	if errors.Is(err, spate.ErrSessionExpired) {
		s.mu.Lock()
		if s.expired == nil {
			s.expired = fmt.Errorf("the session expired: %w: %w", spate.ErrSessionExpired, spate.ErrFatal)
		}
		s.mu.Unlock()
	}
	return OpError(s.p.caps.Driver, op, spate.Ephemeral, key, err)
}

// Create implements [spate.Session].
func (s *portableSession) Create(ctx context.Context, key string, value []byte) (spate.Outcome, error) {
	ctx, h, err := s.begin(ctx, opSessionCreate, key, value, true)
	if err != nil {
		return spate.Outcome{}, err
	}
	defer s.end(h)
	o, err := s.ds.Create(ctx, key, value)
	if err != nil {
		return spate.Outcome{}, s.failed(opSessionCreate, key, err)
	}
	return o, nil
}

// Update implements [spate.Session]. An expected revision of 0 loses at once.
func (s *portableSession) Update(ctx context.Context, key string, value []byte, expected uint64) (spate.Outcome, error) {
	ctx, h, err := s.begin(ctx, opSessionUpdate, key, value, true)
	if err != nil {
		return spate.Outcome{}, err
	}
	defer s.end(h)
	if expected == 0 {
		return spate.Outcome{}, nil
	}
	o, err := s.ds.Update(ctx, key, value, expected)
	if err != nil {
		return spate.Outcome{}, s.failed(opSessionUpdate, key, err)
	}
	return o, nil
}

// KeepAlive implements [spate.Session].
func (s *portableSession) KeepAlive(ctx context.Context) error {
	ctx, h, err := s.begin(ctx, opKeepAlive, "", nil, false)
	if err != nil {
		return err
	}
	defer s.end(h)
	if err := s.ds.KeepAlive(ctx); err != nil {
		return s.failed(opKeepAlive, "", err)
	}
	return nil
}

// Close implements [spate.Session]: it closes the driver's session once; on a
// closed store it returns nil (the store's Close closed the session).
func (s *portableSession) Close() error {
	p := s.p
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.calls.Add(1)
	delete(p.sessions, s)
	p.mu.Unlock()
	defer p.calls.Done()
	if err := s.closeDriver(); err != nil {
		return OpError(p.caps.Driver, opSessionClose, spate.Ephemeral, "", classified(err))
	}
	return nil
}

// ClosedError is the error of a closed store or deployment outside the six
// primitives (a driver's own methods), naming the driver; the primitives
// of a closed [PortableStore] name the call too.
func ClosedError(driver string) error {
	return fmt.Errorf("%s: store is closed: %w: %w", driver, spate.ErrClosed, spate.ErrFatal)
}

// ContextError classifies a context failure as Retryable, keeping the
// context's own error for errors.Is(err, context.Canceled). It returns nil
// when ctx is live.
func ContextError(ctx context.Context, driver, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %s: %w: %w", driver, op, err, spate.ErrRetryable)
	}
	return nil
}

// validateValue checks a value against a store's cap (0 means none); the
// error matches [spate.ErrValueTooLarge] and [spate.ErrFatal].
func validateValue(value []byte, maxSize int) error {
	if maxSize > 0 && len(value) > maxSize {
		return fmt.Errorf("value of %d bytes exceeds the store's cap of %d: %w: %w",
			len(value), maxSize, spate.ErrValueTooLarge, spate.ErrFatal)
	}
	return nil
}
