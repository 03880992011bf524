package conformance_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// ConcurrentCommittersKeepTheirLeases judges the coordinator, not the
// store: a commit that outlasts its op timeout because the store itself
// stopped answering for a while is not the coordinator's failure, one
// that outlasts it because the coordinator queued it behind the others
// is. A NATS server under load did the first (32 of 2,428 commits past a
// 1 s op timeout at once, on a 2 s lease) and failed the rule.

// stallingHarness is the in-memory store that, once per harness, stops
// answering every call of every client for stall: when the first split
// record reaches its 20th update (the lanes are committing by then).
func stallingHarness(stall time.Duration) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness {
		sh := newShared()
		var (
			mu      sync.Mutex
			updates = map[string]int{}
			until   time.Time
		)
		wait := func(context.Context, spate.Keyspace) error {
			mu.Lock()
			d := time.Until(until)
			mu.Unlock()
			if d > 0 && !sh.sleep(d) {
				return spate.Retryablef("the store closed")
			}
			return nil
		}
		return &harness{root: mem.MustNew(mem.Options{TTL: ttl}), sh: sh, wrap: func(s *mem.Store) spate.Store {
			h := &hooked{Store: s, pre: wait}
			h.update = func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				if ks == spate.Durable && strings.HasPrefix(key, "split.") {
					mu.Lock()
					if updates[key]++; updates[key] == 20 && until.IsZero() {
						until = time.Now().Add(stall)
					}
					mu.Unlock()
					if err := wait(ctx, ks); err != nil {
						return spate.Outcome{}, err
					}
				}
				return s.Update(ctx, ks, key, v, exp)
			}
			return h
		}}
	}
}

// queueingHarness is the in-memory store behind a client that runs the
// updates of split records one at a time, each taking hold: commits on
// different splits queue behind each other, as a coordinator that
// serialized them would make them, while every other call (the witness's
// among them) is answered at once.
func queueingHarness(hold time.Duration) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness {
		sh := newShared()
		one := make(chan struct{}, 1) // not a sync.Mutex: time in a bubble moves only while every goroutine waits on a channel or timer
		return &harness{root: mem.MustNew(mem.Options{TTL: ttl}), sh: sh, wrap: func(s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				if ks == spate.Durable && strings.HasPrefix(key, "split.") {
					one <- struct{}{}
					ok := sh.sleep(hold)
					<-one
					if !ok {
						return spate.Outcome{}, spate.Retryablef("the store closed")
					}
				}
				return s.Update(ctx, ks, key, v, exp)
			}}
		}}
	}
}

func TestConcurrentCommittersJudgesTheCoordinatorNotTheStore(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	rule := []string{"ConcurrentCommittersKeepTheirLeases"}
	// The suite's op timeout at this TTL is ttl/4 (375 ms); the scenario
	// measures a round trip of 0 in virtual time and keeps it.
	op := ttl / 4
	t.Run("the store stalls", func(t *testing.T) {
		// Every call waits 1.5 op timeouts: the commits in flight then run
		// out of their op timeout, and so does the witness's call.
		failed := catch(t, conformance.CheckCoordinator, stallingHarness(op*3/2), rule)
		require.Empty(t, failed, "the store stalled, not the coordinator, yet the rule failed:\n%s", verdicts(failed))
	})
	t.Run("commits queue behind each other", func(t *testing.T) {
		// 64 commits one after another, op/8 each: most outlast the op
		// timeout while the store answers everyone else at once.
		failed := catch(t, conformance.CheckCoordinator, queueingHarness(op/8), rule)
		require.Contains(t, failed, rule[0], "commits queued behind each other, yet the rule passed")
		assert.Contains(t, strings.Join(failed[rule[0]], "\n"), "concurrent commits on different splits all succeed", "the rule failed for another reason")
	})
}
