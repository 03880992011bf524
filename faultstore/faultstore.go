// Package faultstore injects store faults for tests: failed operations, writes
// that land but report an error (a lost reply), added latency, broken watch
// streams and whole-store partitions.
//
// An [Injector] holds the rules. [Wrap] puts one in front of any
// [spate.Store]; stores/mem also accepts one directly in its options. Rules
// match by operation, keyspace and key prefix and may be limited to a number
// of hits, so a test can script "the next two plan updates land but report a
// timeout" precisely:
//
//	inj := faultstore.New()
//	inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable,
//		KeyPrefix: "plan", Landed: true, Times: 2})
//	store := faultstore.Wrap(mem.New(mem.Options{TTL: time.Second}), inj)
package faultstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// Op names a store primitive.
type Op uint8

// The six primitives, and a session's KeepAlive.
const (
	Create Op = iota + 1
	Update
	Get
	Delete
	Watch
	List
	// KeepAlive is [spate.Session.KeepAlive]; a session's Create and
	// Update are a [Create] and an [Update] of their key in the
	// [spate.Ephemeral] keyspace.
	KeepAlive
)

var opNames = [...]string{"", "create", "update", "get", "delete", "watch", "list", "keep-alive"}

func (o Op) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ErrInjected is the cause of an injected failure when a rule names none. It
// is reported as Retryable.
var ErrInjected = errors.New("faultstore: injected failure")

// Rule describes one fault.
type Rule struct {
	// Ops the rule applies to; empty means every primitive, a session's
	// KeepAlive included.
	Ops []Op
	// Keyspace the rule applies to; 0 means both.
	Keyspace spate.Keyspace
	// KeyPrefix limits the rule to keys (or watch/list prefixes) starting
	// with it; empty matches everything.
	KeyPrefix string
	// Err is the error to report. nil with a Delay means latency only; nil
	// without a Delay reports ErrInjected as Retryable.
	Err error
	// Landed applies the operation and then reports Err anyway: a write whose
	// reply was lost.
	Landed bool
	// Delay is added before the operation runs (bounded by its context).
	Delay time.Duration
	// Times limits how many operations the rule hits; 0 means unlimited.
	Times int
	// Skip lets this many matching operations through before the rule
	// starts to hit.
	Skip int
	// Match, when set, must also accept the call (it sees the value of a
	// write), e.g. to fail only writes that clear an owner.
	Match func(Call) bool
}

// Call describes one store operation as the rules see it.
type Call struct {
	Op       Op
	Keyspace spate.Keyspace
	Key      string // the key, or the prefix of a watch or list
	Value    []byte // the value of a create or update
}

type rule struct {
	Rule
	left    int // remaining hits; -1 for unlimited
	skipped int
	hits    int
}

// Injector holds fault rules and the partition switch. Its methods are safe
// for concurrent use. The zero value is not usable; call [New].
type Injector struct {
	mu          sync.Mutex
	rules       []*rule
	partitioned bool
	watches     map[*watchTap]struct{}
	injected    int
}

// New returns an injector with no rules.
func New() *Injector { return &Injector{watches: map[*watchTap]struct{}{}} }

// Add installs a rule, checked after the rules added before it. It returns a
// function that removes the rule again.
func (i *Injector) Add(r Rule) (remove func()) {
	rl := &rule{Rule: r, left: -1}
	if r.Times > 0 {
		rl.left = r.Times
	}
	i.mu.Lock()
	i.rules = append(i.rules, rl)
	i.mu.Unlock()
	return func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		for k, x := range i.rules {
			if x == rl {
				i.rules = append(i.rules[:k], i.rules[k+1:]...)
				return
			}
		}
	}
}

// Clear removes every rule (a partition stays until Heal).
func (i *Injector) Clear() {
	i.mu.Lock()
	i.rules = nil
	i.mu.Unlock()
}

// Partition makes every operation fail Retryable and breaks every open
// watch, until Heal: the store is unreachable.
func (i *Injector) Partition() {
	i.mu.Lock()
	i.partitioned = true
	i.mu.Unlock()
	i.BreakWatches()
}

// Heal ends a partition.
func (i *Injector) Heal() {
	i.mu.Lock()
	i.partitioned = false
	i.mu.Unlock()
}

// BreakWatches ends every open watch with a Retryable error event, as a
// dropped connection or a lagged watcher would.
func (i *Injector) BreakWatches() {
	i.mu.Lock()
	taps := make([]*watchTap, 0, len(i.watches))
	for t := range i.watches {
		taps = append(taps, t)
	}
	i.mu.Unlock()
	for _, t := range taps {
		t.breakWith(fmt.Errorf("faultstore: watch broken: %w: %w", ErrInjected, spate.ErrRetryable))
	}
}

// Injected counts the operations a rule or the partition hit so far.
func (i *Injector) Injected() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.injected
}

func (r *rule) matches(c Call) bool {
	if r.left == 0 {
		return false
	}
	if r.Keyspace != 0 && r.Keyspace != c.Keyspace {
		return false
	}
	if r.KeyPrefix != "" && !strings.HasPrefix(c.Key, r.KeyPrefix) {
		return false
	}
	if len(r.Ops) > 0 && !slices.Contains(r.Ops, c.Op) {
		return false
	}
	if r.Match != nil && !r.Match(c) {
		return false
	}
	if r.skipped < r.Skip {
		r.skipped++
		return false
	}
	return true
}

// pick returns the fault for one operation: the first matching rule (its hit
// consumed), whether the store is partitioned.
func (i *Injector) pick(c Call) (Rule, bool, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.partitioned {
		i.injected++
		return Rule{}, false, true
	}
	for _, r := range i.rules {
		if r.matches(c) {
			if r.left > 0 {
				r.left--
			}
			r.hits++
			i.injected++
			return r.Rule, true, false
		}
	}
	return Rule{}, false, false
}

// Apply runs do, one store operation, under the injector's rules: it may
// delay it, skip it and fail, or run it and fail anyway. Drivers that
// support injection natively call it around each primitive.
func (i *Injector) Apply(ctx context.Context, c Call, do func() error) error {
	if i == nil {
		return do()
	}
	op, ks, key := c.Op, c.Keyspace, c.Key
	r, hit, partitioned := i.pick(c)
	if partitioned {
		return fmt.Errorf("faultstore: %s %s %q: store partitioned: %w: %w", op, ks, key, ErrInjected, spate.ErrRetryable)
	}
	if !hit {
		return do()
	}
	if r.Delay > 0 {
		t := time.NewTimer(r.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return driver.ContextError(ctx, "faultstore", op.String())
		}
	}
	var injected error
	switch {
	case r.Err != nil:
		injected = fmt.Errorf("faultstore: %s %s %q: %w", op, ks, key, r.Err)
	case r.Delay == 0:
		injected = fmt.Errorf("faultstore: %s %s %q: %w: %w", op, ks, key, ErrInjected, spate.ErrRetryable)
	}
	if injected == nil {
		return do()
	}
	if r.Landed {
		if err := do(); err != nil {
			return err
		}
	}
	return injected
}

// watchTap forwards one watch stream and can break it.
type watchTap struct {
	once  sync.Once
	brk   chan error
	owner *Injector
}

func (t *watchTap) breakWith(err error) {
	t.once.Do(func() { t.brk <- err })
}

// ApplyWatch opens a watch through open under the injector's rules and
// returns a stream that [Injector.BreakWatches] and [Injector.Partition] can
// break.
func (i *Injector) ApplyWatch(ctx context.Context, ks spate.Keyspace, prefix string,
	open func(ctx context.Context) (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	if i == nil {
		return open(ctx)
	}
	var inner <-chan spate.WatchEvent
	wctx, cancel := context.WithCancel(ctx)
	err := i.Apply(ctx, Call{Op: Watch, Keyspace: ks, Key: prefix}, func() error {
		var err error
		inner, err = open(wctx)
		return err
	})
	if err != nil {
		cancel()
		return nil, err
	}
	tap := &watchTap{brk: make(chan error, 1), owner: i}
	i.mu.Lock()
	i.watches[tap] = struct{}{}
	i.mu.Unlock()
	out := make(chan spate.WatchEvent)
	go func() {
		defer func() {
			cancel()
			i.mu.Lock()
			delete(i.watches, tap)
			i.mu.Unlock()
			close(out)
			// Drain so the inner driver's goroutine is never stuck sending.
			for range inner {
			}
		}()
		for {
			select {
			case ev, ok := <-inner:
				if !ok {
					return
				}
				select {
				case out <- ev:
				case err := <-tap.brk:
					sendErr(ctx, out, err)
					return
				case <-ctx.Done():
					return
				}
				if ev.Kind == spate.WatchError {
					return
				}
			case err := <-tap.brk:
				sendErr(ctx, out, err)
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func sendErr(ctx context.Context, out chan<- spate.WatchEvent, err error) {
	select {
	case out <- spate.WatchEvent{Kind: spate.WatchError, Err: err}:
	case <-ctx.Done():
	}
}

// Wrap returns a store that runs every operation of s through inj. Closing
// the wrapper closes s.
//
// If s has the [spate.Releaser] capability, so does the wrapper: its
// UpdateAndDelete runs through inj as an [Update] of the durable key (a
// rule that fails the durable update fails the whole call, and a Landed
// one lands both writes), as stores/mem does. If s has the
// [spate.Sessioner] capability, so does the wrapper (see its NewSession).
func Wrap(s spate.Store, inj *Injector) spate.Store {
	w := &store{s: s, inj: inj}
	if r, ok := spate.ReleaserOf(s); ok {
		return &releaser{store: w, r: r}
	}
	return w
}

type store struct {
	s   spate.Store
	inj *Injector
}

// releaser is the wrapper of a store with the Releaser capability.
type releaser struct {
	*store
	r spate.Releaser
}

func (w *releaser) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (u, d spate.Outcome, err error) {
	err = w.inj.Apply(ctx, Call{Update, spate.Durable, durableKey, value}, func() (e error) {
		u, d, e = w.r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
		return
	})
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, err
	}
	return u, d, nil
}

// Capabilities reports s's, with WatchKeys only if s has the capability
// (the wrapper passes it on).
func (w *store) Capabilities() spate.Capabilities {
	c := w.s.Capabilities()
	_, c.WatchKeys = spate.KeyWatcherOf(w.s)
	_, c.Sessions = spate.SessionerOf(w.s)
	return c
}

// NewSession implements [spate.Sessioner] when s has it: the session's
// Create and Update run through inj as a [Create] and an [Update] of
// their key in the ephemeral keyspace, its KeepAlive as a [KeepAlive]
// (with the empty key); NewSession and Close are not injected.
func (w *store) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := spate.SessionerOf(w.s)
	if !ok {
		return nil, fmt.Errorf("faultstore: new session: the wrapped store has no Sessioner capability: %w", spate.ErrFatal)
	}
	s, err := sr.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return &session{s: s, inj: w.inj}, nil
}

type session struct {
	s   spate.Session
	inj *Injector
}

func (s *session) Create(ctx context.Context, key string, value []byte) (o spate.Outcome, err error) {
	err = s.inj.Apply(ctx, Call{Create, spate.Ephemeral, key, value}, func() (e error) { o, e = s.s.Create(ctx, key, value); return })
	return outcome(o, err)
}

func (s *session) Update(ctx context.Context, key string, value []byte, expected uint64) (o spate.Outcome, err error) {
	err = s.inj.Apply(ctx, Call{Update, spate.Ephemeral, key, value}, func() (e error) { o, e = s.s.Update(ctx, key, value, expected); return })
	return outcome(o, err)
}

func (s *session) KeepAlive(ctx context.Context) error {
	return s.inj.Apply(ctx, Call{Op: KeepAlive, Keyspace: spate.Ephemeral}, func() error { return s.s.KeepAlive(ctx) })
}

func (s *session) Close() error { return s.s.Close() }
func (w *store) Close() error   { return w.s.Close() }

func (w *store) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (o spate.Outcome, err error) {
	err = w.inj.Apply(ctx, Call{Create, ks, key, value}, func() (e error) { o, e = w.s.Create(ctx, ks, key, value); return })
	return outcome(o, err)
}

func (w *store) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (o spate.Outcome, err error) {
	err = w.inj.Apply(ctx, Call{Update, ks, key, value}, func() (e error) { o, e = w.s.Update(ctx, ks, key, value, expected); return })
	return outcome(o, err)
}

func (w *store) Get(ctx context.Context, ks spate.Keyspace, key string) (en spate.Entry, ok bool, err error) {
	err = w.inj.Apply(ctx, Call{Op: Get, Keyspace: ks, Key: key}, func() (e error) { en, ok, e = w.s.Get(ctx, ks, key); return })
	if err != nil {
		return spate.Entry{}, false, err
	}
	return en, ok, nil
}

func (w *store) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (o spate.Outcome, err error) {
	err = w.inj.Apply(ctx, Call{Op: Delete, Keyspace: ks, Key: key}, func() (e error) { o, e = w.s.Delete(ctx, ks, key, expected); return })
	return outcome(o, err)
}

func (w *store) List(ctx context.Context, ks spate.Keyspace, prefix string) (es []spate.Entry, err error) {
	err = w.inj.Apply(ctx, Call{Op: List, Keyspace: ks, Key: prefix}, func() (e error) { es, e = w.s.List(ctx, ks, prefix); return })
	if err != nil {
		return nil, err
	}
	return es, nil
}

func (w *store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return w.inj.ApplyWatch(ctx, ks, prefix, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return w.s.Watch(ctx, ks, prefix)
	})
}

// WatchKeys implements [spate.KeyWatcher] when s has it: its
// establishment runs through inj as a [Watch] of the first key, and the
// stream can be broken like any watch's.
func (w *store) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(w.s)
	if !ok {
		return nil, fmt.Errorf("faultstore: watch-keys: the wrapped store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	label := ""
	if len(keys) > 0 {
		label = keys[0]
	}
	return w.inj.ApplyWatch(ctx, ks, label, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
		return kw.WatchKeys(ctx, ks, keys)
	})
}

// outcome hides the outcome of a write that reports an error: a caller must
// not learn from a lost reply whether the write landed.
func outcome(o spate.Outcome, err error) (spate.Outcome, error) {
	if err != nil {
		return spate.Outcome{}, err
	}
	return o, nil
}
