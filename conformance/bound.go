package conformance

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// Every rule ends with a verdict within its own bound, whatever the driver
// does inside a call: returns late, never returns, or spins. A rule calls
// the driver through bounded (every store it opens is wrapped: boundstore.go),
// which names the call when it gives up. The design, and why it has two clocks:
//
//   - The call runs on a goroutine of its own; the rule waits for it on a
//     select over its result and a timer of callBound. Outside a bubble
//     the timer is real time. Inside the suite's synctest bubble
//     ([VirtualTime]) it is virtual: it fires as soon as every goroutine
//     of the bubble is durably blocked, so a driver that sleeps, backs off
//     or never returns (blocked on a channel or a timer) costs no wall
//     time, and the rule fails at once naming the call. The rule's own
//     goroutines must block in the same way (a writer that never blocks
//     would hold virtual time still as surely as a spinning driver: see
//     boundaryWriter.writeUntilOpened).
//   - A driver that spins (a busy loop that never blocks) inside a bubble
//     keeps the bubble from ever being idle: virtual time stands still, no
//     timer of the bubble fires, and nothing inside it can end the rule.
//     Nothing outside can either: waking a durably blocked goroutine of a
//     bubble from outside it is a fatal error, and a rule that waited on
//     something outside would not be durably blocked and would freeze
//     virtual time itself. So for a rule run in a bubble, [RunStore]
//     starts a watchdog outside the bubble, on real time, that sees the
//     calls in flight (registered in callWatch, under a mutex: no channel
//     crosses the bubble's edge). A call still in flight after
//     realCallBound of real time means the bubble's clock stood still that
//     long (an in-process driver's call returns in microseconds of real
//     time otherwise); the watchdog then ends the test binary with a
//     message naming the rule and the call, and the goroutine dump shows
//     where the driver spins. That is the only way a bubble with a spinning
//     goroutine can end; without it the run lasted until the binary's
//     -timeout, named nothing, and blamed no call.
//
// What is left after a rule gave up on a call (the driver's goroutine) ends
// when the store or the harness is closed, or never: in a bubble, a
// goroutine that outlives its bubble's test is reported by synctest.

// callBound is the least bound of one call of the driver: a call is one
// round trip, and a driver that retries inside it must give up long before
// this (Retryable) and leave the retry to its caller.
const callBound = 30 * time.Second

// callBoundFor is the bound of one call of a store whose TTL is ttl: at
// least callBound, and two TTLs for a store configured with a long one (a
// call that outlasts two TTLs has outlasted every lease its caller held).
func callBoundFor(ttl time.Duration) time.Duration {
	return max(callBound, 2*ttl)
}

// realCallBound is how long, in real time, the watchdog of a rule run in a
// synctest bubble lets a call stay in flight: inside a bubble a call that
// blocks costs no wall time, so one still running after this keeps the CPU
// busy without blocking.
const realCallBound = eventWait

// errCallBound is what bounded returns for a call that did not return.
func errCallBound(what string, d time.Duration) error {
	return spate.Fatalf("conformance: %s did not return within %v", what, d)
}

// bounded runs call (a call of the driver, named by what, e.g.
// `Watch(durable, "gap.")`) on a goroutine of its own and waits for it at
// most limit. When the call does not return in time it fails the rule
// naming the call and returns errCallBound, so that the caller's own error
// path ends the rule (it may run on any goroutine of the rule). The
// abandoned call's result, if it ever comes, is dropped.
func bounded[T any](e *env, limit time.Duration, what string, call func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	end := e.calls.begin(what)
	go func() {
		defer end()
		v, err := call()
		done <- result{v, err}
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
		e.t.Errorf("rule: a store call returns within its bound (a driver that waits or retries inside a call stops when its context ends, or returns Retryable); %s did not return within %v", what, limit)
		var zero T
		return zero, errCallBound(what, limit)
	}
}

// boundedWatch is s.Watch through bounded (once: a store of env.open is
// bounded already).
func boundedWatch(e *env, s spate.Store, ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	if _, ok := s.(unbound); ok {
		return s.Watch(ctx, ks, prefix)
	}
	return bounded(e, callBound, fmt.Sprintf("Watch(%s, %q)", ks, prefix), func() (<-chan spate.WatchEvent, error) {
		return s.Watch(ctx, ks, prefix)
	})
}

// boundedWatchKeys is kw.WatchKeys through bounded (once: see
// boundedWatch).
func boundedWatchKeys(e *env, kw spate.KeyWatcher, ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	if _, ok := kw.(unbound); ok {
		return kw.WatchKeys(ctx, ks, keys)
	}
	return bounded(e, callBound, watchKeysName(ks, keys), func() (<-chan spate.WatchEvent, error) {
		return kw.WatchKeys(ctx, ks, keys)
	})
}

// watchKeysName names a WatchKeys call.
func watchKeysName(ks spate.Keyspace, keys []string) string {
	if len(keys) <= 3 {
		return fmt.Sprintf("WatchKeys(%s, %q)", ks, keys)
	}
	return fmt.Sprintf("WatchKeys(%s, %d keys)", ks, len(keys))
}

// callWatch holds the driver calls of one rule in flight, for the
// watchdog. The zero value of a nil *callWatch ignores everything (a rule
// run outside a bubble needs no watchdog: its timers are real).
type callWatch struct {
	mu     sync.Mutex
	next   uint64
	flight map[uint64]string
}

func (w *callWatch) begin(what string) (end func()) {
	if w == nil {
		return func() {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	id := w.next
	w.flight[id] = what
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.flight, id)
	}
}

// watchdog starts, outside any bubble, the real-time watchdog of the rule
// named rule (see the top of this file). stop ends it.
func watchdog(rule string) (w *callWatch, stop func()) {
	w = &callWatch{flight: map[uint64]string{}}
	quit := make(chan struct{})
	go func() {
		tick := time.NewTicker(realCallBound / 20)
		defer tick.Stop()
		seen := map[uint64]time.Time{}
		for {
			select {
			case <-quit:
				return
			case now := <-tick.C:
				w.mu.Lock()
				for id := range seen {
					if _, ok := w.flight[id]; !ok {
						delete(seen, id)
					}
				}
				var stuck string
				for id, what := range w.flight {
					at, ok := seen[id]
					if !ok {
						seen[id] = now
					} else if now.Sub(at) >= realCallBound {
						stuck = what
					}
				}
				w.mu.Unlock()
				if stuck != "" {
					msg := fmt.Sprintf("conformance: rule %s: %s has not returned after %v of real time while the rule's synctest bubble stood still: "+
						"the driver keeps the CPU busy inside the call without ever blocking (a busy loop), so no timer of the bubble can fire and the rule cannot end; "+
						"a driver must block (on its context, a timer, the network) while it waits. The goroutines follow.", rule, stuck, realCallBound)
					fmt.Fprintln(os.Stderr, msg)
					panic(msg)
				}
			}
		}
	}()
	return w, func() { close(quit) }
}
