package spate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Driver is the backend half of a store: what a driver package implements
// and [NewStore] turns into a [Store] (as Go CDK's blob.Bucket wraps a
// driver.Bucket). The portable layer does everything the six primitives
// share, once, so a Driver does only the backend's part:
//
//   - it is never called after Close has begun, and Close is called exactly
//     once, after every other call has returned;
//   - every call has a valid keyspace and a valid key ([ValidateKey]; a
//     valid prefix, [ValidatePrefix], for Watch and List), a context that
//     was live when the call began, and, for Create and Update, a value
//     within [Capabilities.MaxValueSize];
//   - Update is never called with expected revision 0 (no live key has it;
//     the layer answers Lost);
//   - a call's context, and the context a watch's stream runs on, is
//     cancelled when Close begins (its cause matches [ErrClosed]), so a
//     driver need not track its calls to end them.
//
// A driver's own methods that touch the driver run under
// [PortableStore.Do], which holds them to the same rule.
//
// Capabilities is called once, by [NewStore]: the store reports that
// snapshot for its lifetime.
//
// A Driver classifies its own errors: each error it returns, and each
// [WatchError] it sends, wraps [ErrRetryable] or [ErrFatal] (see [Store]
// for which). The layer adds the driver, the operation, the keyspace and
// the key in front of a returned error ([OpError]), so a driver's message
// starts with what went wrong, not with its own name; a returned error the
// driver left unclassified gets the class [KindOf] gives it. A WatchError
// reaches the caller as the driver sent it, so the driver formats it with
// [OpError] itself. A Driver makes one attempt per call: retries live in
// the coordinator.
//
// Close releases what the driver started and ends its watches; the layer
// calls it once, so it need not be idempotent.
//
// A Driver may also implement [Releaser]; the layer then reports
// [Capabilities.UpdateAndDelete] and passes the call on under the same
// rules: both keys valid, the value within the cap, and neither expected
// nor leaseExpected ever 0 (the layer answers both Lost for the first and
// makes the call a plain Update for the second).
//
// A Driver may also implement [KeyWatcher]; the layer then reports
// [Capabilities.WatchKeys] and passes the call on with 1 to
// [MaxWatchKeys] valid keys, sorted, each listed once.
//
// A Driver may also implement [Sessioner]; the layer then reports
// [Capabilities.Sessions] and wraps each driver [Session] under the same
// rules: its Create and Update get a valid key, a value within the cap, a
// live context that Close cancels, and never an expected revision of 0;
// no call reaches a session after it reported [ErrSessionExpired]; and the
// layer calls each session's Close exactly once, after every call on the
// session has returned (those in flight have their context cancelled) and
// at the latest when the store closes, before the driver's Close.
type Driver interface {
	Capabilities() Capabilities
	Create(ctx context.Context, ks Keyspace, key string, value []byte) (Outcome, error)
	Update(ctx context.Context, ks Keyspace, key string, value []byte, expected uint64) (Outcome, error)
	Get(ctx context.Context, ks Keyspace, key string) (Entry, bool, error)
	Delete(ctx context.Context, ks Keyspace, key string, expected uint64) (Outcome, error)
	Watch(ctx context.Context, ks Keyspace, prefix string) (<-chan WatchEvent, error)
	List(ctx context.Context, ks Keyspace, prefix string) ([]Entry, error)
	Close() error
}

// PortableStore is the [Store] over a [Driver]: closed state, argument
// checks, the value cap, the revision-0 rule and the error format live
// here, once, for every driver. Driver packages return it embedded in
// their own Store type, which adds the driver's own methods.
//
// It tracks the calls in flight: Close refuses new calls, cancels the
// context of those in flight (and of every watch), waits for them to
// return, and only then closes the driver, so no call reaches a driver
// after Close.
type PortableStore struct {
	d    Driver
	caps Capabilities

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

var _ Store = (*PortableStore)(nil)

// NewStore wraps d into a [Store]. It calls d.Capabilities once.
func NewStore(d Driver) *PortableStore {
	caps := d.Capabilities()
	_, caps.UpdateAndDelete = d.(Releaser)
	_, caps.WatchKeys = d.(KeyWatcher)
	_, caps.Sessions = d.(Sessioner)
	return &PortableStore{d: d, caps: caps, live: map[uint64]context.CancelCauseFunc{}}
}

var (
	_ Releaser   = (*PortableStore)(nil)
	_ KeyWatcher = (*PortableStore)(nil)
	_ Sessioner  = (*PortableStore)(nil)
)

// OpError is the one format of a store operation's error:
//
//	<driver>: <op> <keyspace> "<key>": <err>
//
// [PortableStore] puts it in front of every error it returns; drivers use
// it for the [WatchError] events they send, which reach the caller as
// they are. err keeps its class.
func OpError(driver, op string, ks Keyspace, key string, err error) error {
	return fmt.Errorf("%s: %s %s %q: %w", driver, op, ks, key, err)
}

var (
	// errClosed is the error of a call made after Close began.
	errClosed = fmt.Errorf("store is closed: %w: %w", ErrClosed, ErrFatal)
	// errClosing is the cause of the context of a call in flight when
	// Close began. It carries no class: the call may have landed a write,
	// so the driver's error for it stays Retryable.
	errClosing = fmt.Errorf("the store was closed while the call was in flight: %w", ErrClosed)
)

// Capabilities implements [Store]: the driver's, as reported when the
// store was made (each caller gets its own copy of the lists).
func (p *PortableStore) Capabilities() Capabilities {
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
func (p *PortableStore) begin(ctx context.Context, op string, ks Keyspace, key string, isPrefix bool, value []byte, write bool) (context.Context, hold, error) {
	var err error
	switch {
	case !ks.Valid():
		err = fmt.Errorf("invalid keyspace: %w", ErrFatal)
	case isPrefix:
		err = ValidatePrefix(key)
	default:
		err = ValidateKey(key)
	}
	if err == nil && write {
		err = ValidateValue(value, p.caps.MaxValueSize)
	}
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", ctx.Err(), ErrRetryable)
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
func (p *PortableStore) fail(op string, ks Keyspace, key string, err error) error {
	return OpError(p.caps.Driver, op, ks, key, classified(err))
}

// classified returns err with a class: its own, or the one [KindOf] gives.
func classified(err error) error {
	if errors.Is(err, ErrRetryable) || errors.Is(err, ErrFatal) {
		return err
	}
	if KindOf(err) == KindRetryable {
		return fmt.Errorf("%w: %w", err, ErrRetryable)
	}
	return fmt.Errorf("%w: %w", err, ErrFatal)
}

// Create implements [Store].
func (p *PortableStore) Create(ctx context.Context, ks Keyspace, key string, value []byte) (Outcome, error) {
	ctx, h, err := p.begin(ctx, "create", ks, key, false, value, true)
	if err != nil {
		return Outcome{}, err
	}
	defer p.end(h, true)
	o, err := p.d.Create(ctx, ks, key, value)
	if err != nil {
		return Outcome{}, p.fail("create", ks, key, err)
	}
	return o, nil
}

// Update implements [Store]. An expected revision of 0 loses at once: no
// live key has it.
func (p *PortableStore) Update(ctx context.Context, ks Keyspace, key string, value []byte, expected uint64) (Outcome, error) {
	ctx, h, err := p.begin(ctx, "update", ks, key, false, value, true)
	if err != nil {
		return Outcome{}, err
	}
	defer p.end(h, true)
	if expected == 0 {
		return Outcome{}, nil
	}
	o, err := p.d.Update(ctx, ks, key, value, expected)
	if err != nil {
		return Outcome{}, p.fail("update", ks, key, err)
	}
	return o, nil
}

// Get implements [Store].
func (p *PortableStore) Get(ctx context.Context, ks Keyspace, key string) (Entry, bool, error) {
	ctx, h, err := p.begin(ctx, "get", ks, key, false, nil, false)
	if err != nil {
		return Entry{}, false, err
	}
	defer p.end(h, true)
	e, ok, err := p.d.Get(ctx, ks, key)
	if err != nil {
		return Entry{}, false, p.fail("get", ks, key, err)
	}
	return e, ok, nil
}

// Delete implements [Store].
func (p *PortableStore) Delete(ctx context.Context, ks Keyspace, key string, expected uint64) (Outcome, error) {
	ctx, h, err := p.begin(ctx, "delete", ks, key, false, nil, false)
	if err != nil {
		return Outcome{}, err
	}
	defer p.end(h, true)
	o, err := p.d.Delete(ctx, ks, key, expected)
	if err != nil {
		return Outcome{}, p.fail("delete", ks, key, err)
	}
	return o, nil
}

// opUpdateAndDelete names [PortableStore.UpdateAndDelete] in errors.
const opUpdateAndDelete = "update-and-delete"

// UpdateAndDelete implements [Releaser] when the driver does (see
// [Capabilities.UpdateAndDelete]); on a driver without it, it returns a
// Fatal error and writes nothing. An expected revision of 0 loses both at
// once, and a leaseExpected of 0 makes the call a plain Update. Errors
// name the durable key, or the ephemeral key when it is the invalid one.
func (p *PortableStore) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (Outcome, Outcome, error) {
	ctx, h, err := p.begin(ctx, opUpdateAndDelete, Durable, durableKey, false, value, true)
	if err != nil {
		return Outcome{}, Outcome{}, err
	}
	defer p.end(h, true)
	if err := ValidateKey(ephemeralKey); err != nil {
		return Outcome{}, Outcome{}, OpError(p.caps.Driver, opUpdateAndDelete, Ephemeral, ephemeralKey, err)
	}
	r, ok := p.d.(Releaser)
	if !ok {
		return Outcome{}, Outcome{}, OpError(p.caps.Driver, opUpdateAndDelete, Durable, durableKey,
			fmt.Errorf("the driver cannot update and delete in one call (Capabilities.UpdateAndDelete is false): %w", ErrFatal))
	}
	if expected == 0 {
		return Outcome{}, Outcome{}, nil
	}
	var u, d Outcome
	if leaseExpected == AnyRevision {
		u, err = p.d.Update(ctx, Durable, durableKey, value, expected)
	} else {
		u, d, err = r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
	}
	if err != nil {
		return Outcome{}, Outcome{}, p.fail(opUpdateAndDelete, Durable, durableKey, err)
	}
	return u, d, nil
}

// List implements [Store].
func (p *PortableStore) List(ctx context.Context, ks Keyspace, prefix string) ([]Entry, error) {
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

// Watch implements [Store]. The driver's stream gets a context that ends
// with ctx or when Close begins, and goes to the caller as the driver sends
// it (no forwarding hop that would hold an event back).
func (p *PortableStore) Watch(ctx context.Context, ks Keyspace, prefix string) (<-chan WatchEvent, error) {
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

// WatchKeys implements [KeyWatcher] when the driver does (see
// [Capabilities.WatchKeys]); on a driver without it, it returns a Fatal
// error. The keys reach the driver sorted and de-duplicated; an error names
// the first key listed (or the one at fault).
func (p *PortableStore) WatchKeys(ctx context.Context, ks Keyspace, keys []string) (<-chan WatchEvent, error) {
	label := ""
	if len(keys) > 0 {
		label = keys[0]
	}
	var bad error
	switch {
	case len(keys) == 0:
		bad = fmt.Errorf("no keys to watch: %w", ErrFatal)
	case len(keys) > MaxWatchKeys:
		bad = fmt.Errorf("%d keys to watch, more than MaxWatchKeys (%d): %w", len(keys), MaxWatchKeys, ErrFatal)
	}
	for _, k := range keys {
		if bad != nil {
			break
		}
		if err := ValidateKey(k); err != nil {
			label, bad = k, err
		}
	}
	if bad != nil {
		return nil, OpError(p.caps.Driver, opWatchKeys, ks, label, bad)
	}
	kw, ok := p.d.(KeyWatcher)
	if !ok {
		return nil, OpError(p.caps.Driver, opWatchKeys, ks, label,
			fmt.Errorf("the driver cannot watch a set of keys (Capabilities.WatchKeys is false): %w", ErrFatal))
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

// Close implements [Store]: it refuses new calls, cancels the calls in
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

// The operations of a [Session], as errors name them.
const (
	opSessionNew    = "session-new"
	opSessionCreate = "session-create"
	opSessionUpdate = "session-update"
	opKeepAlive     = "keep-alive"
	opSessionClose  = "session-close"
)

// NewSession implements [Sessioner] when the driver does (see
// [Capabilities.Sessions]); on a driver without it, it returns a Fatal
// error. The Session it returns applies the store's checks to every call
// (valid key, value cap, the revision-0 rule, a live context, the store's
// closed state) and formats its errors with [OpError], naming the
// [Ephemeral] keyspace and the key ("" for the session's own calls). The
// store's Close closes every open session, and after it every session
// call fails with [ErrClosed] and [ErrFatal].
func (p *PortableStore) NewSession(ctx context.Context) (Session, error) {
	sr, ok := p.d.(Sessioner)
	if !ok {
		return nil, OpError(p.caps.Driver, opSessionNew, Ephemeral, "",
			fmt.Errorf("the driver has no sessions (Capabilities.Sessions is false): %w", ErrFatal))
	}
	ctx, h, err := p.begin(ctx, opSessionNew, Ephemeral, "", true, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.end(h, true)
	ds, err := sr.NewSession(ctx)
	if err != nil {
		return nil, p.fail(opSessionNew, Ephemeral, "", err)
	}
	ps := &portableSession{p: p, ds: ds}
	p.mu.Lock()
	if p.closed {
		// Close began while the session was being made: it will not see
		// this one, so end it here (Close waits for this call first).
		p.mu.Unlock()
		_ = ps.closeDriver()
		return nil, OpError(p.caps.Driver, opSessionNew, Ephemeral, "", errClosed)
	}
	if p.sessions == nil {
		p.sessions = map[*portableSession]struct{}{}
	}
	p.sessions[ps] = struct{}{}
	p.mu.Unlock()
	return ps, nil
}

// portableSession is the [Session] of a [PortableStore] over a driver's.
type portableSession struct {
	p  *PortableStore
	ds Session

	mu      sync.Mutex
	closed  bool  // Close began (or the store's Close closed it)
	expired error // the driver's ErrSessionExpired, once reported
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
	errSessionClosed = fmt.Errorf("session is closed: %w: %w", ErrClosed, ErrFatal)
	// errSessionClosing is the cause of the context of a session call in
	// flight when the session's Close began; like errClosing it carries
	// no class.
	errSessionClosing = fmt.Errorf("the session was closed while the call was in flight: %w", ErrClosed)
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
		cctx, h, err = p.begin(ctx, op, Ephemeral, key, false, value, true)
	} else {
		cctx, h, err = p.begin(ctx, op, Ephemeral, "", true, nil, false)
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
		return nil, hold{}, OpError(p.caps.Driver, op, Ephemeral, key, err)
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
	if errors.Is(err, ErrSessionExpired) {
		s.mu.Lock()
		if s.expired == nil {
			s.expired = fmt.Errorf("the session expired: %w: %w", ErrSessionExpired, ErrFatal)
		}
		s.mu.Unlock()
	}
	return OpError(s.p.caps.Driver, op, Ephemeral, key, err)
}

// Create implements [Session].
func (s *portableSession) Create(ctx context.Context, key string, value []byte) (Outcome, error) {
	ctx, h, err := s.begin(ctx, opSessionCreate, key, value, true)
	if err != nil {
		return Outcome{}, err
	}
	defer s.end(h)
	o, err := s.ds.Create(ctx, key, value)
	if err != nil {
		return Outcome{}, s.failed(opSessionCreate, key, err)
	}
	return o, nil
}

// Update implements [Session]. An expected revision of 0 loses at once.
func (s *portableSession) Update(ctx context.Context, key string, value []byte, expected uint64) (Outcome, error) {
	ctx, h, err := s.begin(ctx, opSessionUpdate, key, value, true)
	if err != nil {
		return Outcome{}, err
	}
	defer s.end(h)
	if expected == 0 {
		return Outcome{}, nil
	}
	o, err := s.ds.Update(ctx, key, value, expected)
	if err != nil {
		return Outcome{}, s.failed(opSessionUpdate, key, err)
	}
	return o, nil
}

// KeepAlive implements [Session].
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

// Close implements [Session]: it closes the driver's session once; on a
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
		return OpError(p.caps.Driver, opSessionClose, Ephemeral, "", classified(err))
	}
	return nil
}
