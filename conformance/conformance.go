package conformance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance/internal/kit"
)

// Harness gives the suite stores over one fresh namespace.
//
// Whoever opens a thing closes it. The suite closes every store it gets
// from NewStore, and then the harness, once, when the subtest that made it
// ends. The harness closes what it opened itself: the namespace, any server
// it started, and the client behind each store. A store's Close alone does
// not release that client when the driver borrows it: stores/etcd,
// stores/nats and stores/redis never close the client they are given. So
// Close must close every client NewStore opened (the harnesses of
// stores/etcd/etcdtest, stores/nats/natstest and stores/redis/redistest
// do). Run under a goroutine leak check (go.uber.org/goleak), a harness
// that keeps to this leaves nothing running after the suite.
type Harness interface {
	// NewStore opens a new store client over the harness's namespace. All
	// stores of one harness see the same data, as separate processes would.
	// Each store reports the harness's TTL. The suite closes every store it
	// opens, before it closes the harness.
	NewStore(ctx context.Context) (spate.Store, error)
	// Close releases everything the harness opened: the clients behind its
	// stores and anything it started. The suite calls it once, after it
	// has closed the harness's stores.
	Close() error
}

// HarnessMaker makes a harness with a fresh namespace, so that subtests never
// see each other's keys. It fails t when it cannot.
type HarnessMaker func(t testing.TB) Harness

// Option tunes how the suite runs.
type Option func(*options)

type options struct {
	virtualTime bool
	serial      bool // subtests share something they break (a server): one at a time
	skip        map[string]string
	parallel    int               // CheckStore, CheckCoordinator: rules at once
	selected    func(string) bool // nil: every rule
	onResult    func(Result)      // CheckStore, CheckCoordinator: as each rule ends
}

// VirtualTime runs every subtest inside a testing/synctest bubble, so waits of
// several TTLs cost no wall time. Only drivers whose clock and goroutines live
// in the test process (stores/mem) can use it; the harness is made inside the
// bubble. It needs a testing.T: [CheckStore] refuses it.
func VirtualTime() Option { return func(o *options) { o.virtualTime = true } }

// Skip skips the named rule with a reason. Use it only for a rule the
// driver documents it cannot keep; the skip is visible in the test output.
// A name that is not a rule of the suite is an error: the suite refuses to
// run rather than skip nothing.
func Skip(name, reason string) Option {
	return func(o *options) {
		if o.skip == nil {
			o.skip = map[string]string{}
		}
		o.skip[name] = reason
	}
}

// Select runs only the rules for which keep returns true. keep gets the
// rule's full name: the suite, a slash and the rule ("Store/GuardedDelete",
// "Coordinator/LiveTwinsFailFatal").
func Select(keep func(rule string) bool) Option {
	return func(o *options) { o.selected = keep }
}

// Parallel bounds how many rules [CheckStore] and [CheckCoordinator] run at
// once (default GOMAXPROCS). Under a testing.T, -test.parallel does.
func Parallel(n int) Option { return func(o *options) { o.parallel = n } }

// OnResult has [CheckStore] and [CheckCoordinator] call report as each rule
// ends, one call at a time.
func OnResult(report func(Result)) Option { return func(o *options) { o.onResult = report } }

// collect applies opts for a suite whose rules are named names, and refuses
// a Skip of a name that is none of them.
func collect(suite string, names []string, opts []Option) (options, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	for _, name := range slices.Sorted(maps.Keys(o.skip)) {
		if !slices.Contains(names, name) {
			return o, fmt.Errorf("conformance: Skip(%q): %s has no rule of that name (its rules are listed in %sRules)", name, suite, suite)
		}
	}
	return o, nil
}

// keep reports whether the rule name of suite is selected.
func (o options) keep(suite, name string) bool {
	return o.selected == nil || o.selected(suite+"/"+name)
}

// env is what a subtest body gets: the harness and helpers bound to t.
type env struct {
	t   testing.TB
	h   Harness
	mk  HarnessMaker // for a body that needs more than one fresh namespace
	ctx context.Context
	// virtual says the body runs in a synctest bubble ([VirtualTime]):
	// its clock is virtual, and moves only while every goroutine of the
	// bubble is blocked.
	virtual bool
	// calls are the driver calls in flight, seen by the watchdog of a
	// rule run in a bubble (bound.go); nil otherwise.
	calls *callWatch
	// after runs once the body is done, outside any synctest bubble: for
	// CPU-bound checks (porcupine) whose timeouts must be real time.
	after []func(t testing.TB)
}

// open opens a store and closes it at cleanup. Every call of the store it
// returns is bounded (boundstore.go).
func (e *env) open() spate.Store {
	e.t.Helper()
	s, err := openStore(e.ctx, e.h)
	if err != nil {
		e.t.Fatalf("harness: open store: %v", err)
	}
	b := bind(e, s)
	e.t.Cleanup(func() { _ = b.Close() })
	return b
}

// ttlPasses is how many times withinATTL makes a pass that outlasted the
// TTL before it judges the rule by the last one.
const ttlPasses = 3

// withinATTL runs pass, a sequence of writes and reads of keyspace ks on s
// that judges itself and returns its failure ("" for none), and fails the
// rule with it. An ephemeral key lives at least one TTL from the start of
// its last write and may be gone after that, which no rule forbids; the
// tests' TTLs are the stores' floors (2 s on NATS), and a loaded machine
// can stall a process for that long between two calls. So a pass on the
// ephemeral keyspace that failed after running for a TTL or more (from
// its start to its end) is made again, with its attempt number (0, 1, ...)
// to name fresh keys by, up to ttlPasses times; a pass that failed within
// a TTL, or on the durable keyspace, or the last pass, fails the rule.
// Each pass left out is logged.
func (e *env) withinATTL(s spate.Store, ks spate.Keyspace, pass func(attempt int) string) {
	e.t.Helper()
	ttl := s.Capabilities().TTL
	for attempt := 0; ; attempt++ {
		began := time.Now()
		failure := pass(attempt)
		took := time.Since(began)
		if failure == "" {
			return
		}
		if ks != spate.Ephemeral || took < ttl || attempt+1 >= ttlPasses {
			e.t.Fatalf("%s (the pass took %v; TTL %v; attempt %d of at most %d)", failure, took.Round(time.Millisecond), ttl, attempt+1, ttlPasses)
		}
		e.t.Logf("a pass that took %v, a TTL (%v) or more, failed: its key may have expired; again with a fresh key (%d of at most %d): %s",
			took.Round(time.Millisecond), ttl, attempt+2, ttlPasses, failure)
	}
}

// openRetryBudget bounds how long openStore retries Retryable failures.
const openRetryBudget = 30 * time.Second

// openStore opens a store the way an application should: a Retryable
// failure (a server still restarting after a failover fault, JetStream not
// yet ready) is retried with backoff for up to openRetryBudget; anything
// else is returned at once.
func openStore(ctx context.Context, h Harness) (spate.Store, error) {
	deadline := time.Now().Add(openRetryBudget)
	backoff := 50 * time.Millisecond
	for {
		s, err := h.NewStore(ctx)
		if err == nil || !spate.IsRetryable(err) || time.Now().Add(backoff).After(deadline) {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// run runs body as the subtest name, in a bubble when asked.
func run(t *testing.T, o options, name string, mk HarnessMaker, body func(e *env)) {
	t.Run(name, func(t *testing.T) {
		if why, ok := o.skip[name]; ok {
			t.Skip(why)
		}
		if !o.serial {
			t.Parallel()
		}
		var after []func(testing.TB)
		if o.virtualTime {
			// The watchdog runs outside the bubble, on real time
			// (bound.go).
			calls, stop := watchdog(t.Name())
			defer stop()
			synctest.Test(t, func(t *testing.T) { after = runBody(t, mk, body, true, calls) })
		} else {
			after = runBody(t, mk, body, false, nil)
		}
		for _, f := range after {
			f(t)
		}
	})
}

// runBody runs body on a fresh harness as the rule tb is running, and
// returns the checks to run once it is done, outside any bubble. virtual
// says the body runs in a synctest bubble; calls is then the real-time
// watchdog's view of its driver calls (bound.go), or nil.
func runBody(tb testing.TB, mk HarnessMaker, body func(e *env), virtual bool, calls *callWatch) []func(testing.TB) {
	h := mk(tb)
	tb.Cleanup(func() { closeHarness(tb, h) })
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	e := &env{t: tb, h: h, mk: mk, ctx: ctx, virtual: virtual, calls: calls}
	body(e)
	return e.after
}

// closeHarness closes h and fails tb if that fails (kit.CloseHarness).
func closeHarness(tb testing.TB, h Harness) { kit.CloseHarness(tb, h, "rule") }

// recvTimeout receives one watch event or fails after d.
func recvTimeout(t testing.TB, ch <-chan spate.WatchEvent, d time.Duration, what string) spate.WatchEvent {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("rule: a watch ends only when its context is cancelled, its store closed or it breaks (with a WatchError); it closed while waiting for %s", what)
		}
		return ev
	case <-timer.C:
		t.Fatalf("rule: a watch delivers %s; no watch event within %v", what, d)
	}
	return spate.WatchEvent{}
}
