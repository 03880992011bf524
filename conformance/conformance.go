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
// suite is itself tested: this package's tests run it against deliberately
// broken drivers, one per rule, and require each to be caught.
package conformance

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spate-go/spate"
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
}

// VirtualTime runs every subtest inside a testing/synctest bubble, so waits of
// several TTLs cost no wall time. Only drivers whose clock and goroutines live
// in the test process (stores/mem) can use it; the harness is made inside the
// bubble.
func VirtualTime() Option { return func(o *options) { o.virtualTime = true } }

// Skip skips the named subtest with a reason. Use it only for a rule the
// driver documents it cannot keep; the skip is visible in the test output.
func Skip(name, reason string) Option {
	return func(o *options) {
		if o.skip == nil {
			o.skip = map[string]string{}
		}
		o.skip[name] = reason
	}
}

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// env is what a subtest body gets: the harness and helpers bound to t.
type env struct {
	t   *testing.T
	h   Harness
	mk  HarnessMaker // for a body that needs more than one fresh namespace
	ctx context.Context
	// after runs once the body is done, outside any synctest bubble: for
	// CPU-bound checks (porcupine) whose timeouts must be real time.
	after []func(t *testing.T)
}

// open opens a store and closes it at cleanup.
func (e *env) open() spate.Store {
	e.t.Helper()
	s, err := openStore(e.ctx, e.h)
	if err != nil {
		e.t.Fatalf("harness: open store: %v", err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
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
		var after []func(*testing.T)
		inner := func(t *testing.T) {
			h := mk(t)
			t.Cleanup(func() { _ = h.Close() })
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			e := &env{t: t, h: h, mk: mk, ctx: ctx}
			defer func() { after = e.after }()
			body(e)
		}
		if o.virtualTime {
			synctest.Test(t, inner)
		} else {
			inner(t)
		}
		for _, f := range after {
			f(t)
		}
	})
}

// recvTimeout receives one watch event or fails after d.
func recvTimeout(t *testing.T, ch <-chan spate.WatchEvent, d time.Duration, what string) spate.WatchEvent {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed while waiting for %s", what)
		}
		return ev
	case <-timer.C:
		t.Fatalf("no watch event within %v while waiting for %s", d, what)
	}
	return spate.WatchEvent{}
}
