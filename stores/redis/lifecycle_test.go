package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redistest"
)

// countingStore records every keyed call a coordinator makes on the store.
// It passes the Releaser capability on unless plain is set.
type countingStore struct {
	spate.Store
	plain bool
	mu    sync.Mutex
	calls []storeCall
}

func (s *countingStore) Capabilities() spate.Capabilities {
	c := s.Store.Capabilities()
	_, c.UpdateAndDelete = spate.ReleaserOf(s.Store)
	c.UpdateAndDelete = c.UpdateAndDelete && !s.plain
	return c
}

func (s *countingStore) UpdateAndDelete(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
	r, ok := spate.ReleaserOf(s.Store)
	if !ok || s.plain {
		return spate.Outcome{}, spate.Outcome{}, fmt.Errorf("no Releaser capability: %w", spate.ErrFatal)
	}
	u, d, err := r.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
	s.record("update-and-delete", spate.Durable, dk, u.Won && d.Won, err)
	return u, d, err
}

type storeCall struct {
	op     string // create, update, delete, get
	ks     spate.Keyspace
	key    string
	result string // won, lost, found, absent or the error
}

func (c storeCall) String() string { return c.op + "/" + c.ks.String() }

func (c storeCall) detail() string { return c.String() + ":" + c.result }

func (s *countingStore) record(op string, ks spate.Keyspace, key string, ok bool, err error) {
	r := map[bool]string{true: "won", false: "lost"}[ok]
	if op == "get" {
		r = map[bool]string{true: "found", false: "absent"}[ok]
	}
	if err != nil {
		r = err.Error()
	}
	s.mu.Lock()
	s.calls = append(s.calls, storeCall{op, ks, key, r})
	s.mu.Unlock()
}

func (s *countingStore) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	o, err := s.Store.Create(ctx, ks, key, value)
	s.record("create", ks, key, o.Won, err)
	return o, err
}

func (s *countingStore) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	o, err := s.Store.Update(ctx, ks, key, value, expected)
	s.record("update", ks, key, o.Won, err)
	return o, err
}

func (s *countingStore) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	o, err := s.Store.Delete(ctx, ks, key, expected)
	s.record("delete", ks, key, o.Won, err)
	return o, err
}

func (s *countingStore) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	e, ok, err := s.Store.Get(ctx, ks, key)
	s.record("get", ks, key, ok, err)
	return e, ok, err
}

// mark returns the number of calls so far.
func (s *countingStore) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// since returns the calls on key after mark, without lease renewals (an
// update of the ephemeral key), which run on their own clock; it reports
// how many renewals it left out.
func (s *countingStore) since(mark int, key string) (calls []string, renewals int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.calls[mark:] {
		switch {
		case c.key != key:
		case c.op == "update" && c.ks == spate.Ephemeral:
			renewals++
		default:
			calls = append(calls, c.String())
		}
	}
	return calls, renewals
}

func (s *countingStore) all(mark int, key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls[mark:] {
		if c.key == key {
			out = append(out, c.detail())
		}
	}
	return out
}

type lifecyclePlanner struct{ splits []spate.PlannedSplit }

func (p *lifecyclePlanner) Fingerprint() string { return "redis:lifecycle" }
func (p *lifecyclePlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	return spate.NewSplitPlan(p.splits, spate.PlanFinal), nil
}

// TestStoreCallsPerLifecycle counts the store calls the coordinator makes
// on one split's keys on the Redis driver, as the root package's test of
// the same name does against its fake store: a commit is one call, a
// release one (the driver's UpdateAndDelete: owner clear and lease delete
// in one script), or two (owner clear, lease delete) with the capability
// hidden, a claim two (lease create, epoch-bumping compare-and-swap), and
// a takeover of a dead owner's split two as well. Lease renewals run on
// their own clock and are left out; the full sequence of calls and their
// outcomes is logged.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Parallel()
	t.Run("releaser", func(t *testing.T) { storeCallsPerLifecycle(t, false) })
	t.Run("plain", func(t *testing.T) { storeCallsPerLifecycle(t, true) })
}

func storeCallsPerLifecycle(t *testing.T, plain bool) {
	const ttl = 3 * time.Second
	srv := redistest.Start(t)
	h := srv.NewHarness(t, ttl)
	cfg := spate.Config{
		LeaseDuration:     ttl,
		OpTimeout:         time.Second,
		ReplanInterval:    ttl,
		ReconcileInterval: 300 * time.Millisecond,
		DrainDeadline:     ttl / 2,
		RebalanceDelay:    spate.NoRebalanceDelay,
		MaxInFlight:       8,
	}
	// Two splits, so handing one back is never the worker's departure.
	plan := &lifecyclePlanner{}
	for i := range 2 {
		plan.splits = append(plan.splits, spate.NewPlannedSplit(spate.NewSplitSpec(
			spate.MustSplitID(fmt.Sprintf("life-%02d", i)), []byte("range"))))
	}
	id := spate.MustSplitID("life-00")
	key := "split." + id.String()

	start := func(name string) (*spate.StoreCoordinator, *countingStore, spate.Waker) {
		st, err := h.Open(t.Context())
		require.NoError(t, err)
		cs := &countingStore{Store: st, plain: plain}
		c := cfg
		c.InstanceID = name
		co, err := spate.NewStoreCoordinator(cs, c)
		require.NoError(t, err)
		w := spate.NewWaker()
		co.SetWaker(w)
		require.NoError(t, co.Start(plan))
		t.Cleanup(func() { _ = co.Close() })
		return co, cs, w
	}
	// gain polls co until it gains want (all of them), within a few leases.
	gain := func(co *spate.StoreCoordinator, w spate.Waker, want ...spate.SplitID) {
		t.Helper()
		deadline := time.Now().Add(10 * ttl)
		for len(want) > 0 {
			require.True(t, time.Now().Before(deadline), "never gained %v", want)
			select {
			case <-w.C():
			case <-time.After(50 * time.Millisecond):
			}
			evs, err := co.Poll()
			require.NoError(t, err)
			for _, ev := range evs {
				if g, ok := ev.(spate.Gained); ok {
					want = slices.DeleteFunc(want, func(s spate.SplitID) bool { return s == g.Split.ID })
				}
			}
		}
	}
	const settle = 300 * time.Millisecond
	phase := func(cs *countingStore, what string, f func()) []string {
		t.Helper()
		m := cs.mark()
		f()
		time.Sleep(settle)
		calls, renewals := cs.since(m, key)
		t.Logf("%s: %d store calls on %s %v (and %d lease renewals); all: %v", what, len(calls), key, calls, renewals, cs.all(m, key))
		return calls
	}

	owner, ocs, ow := start("owner")
	gain(owner, ow, plan.splits[0].Spec.ID, plan.splits[1].Spec.ID)
	time.Sleep(settle)

	assert.Equal(t, []string{"update/durable"}, phase(ocs, "commit", func() {
		require.NoError(t, owner.Commit(t.Context(), id, spate.NewSplitProgress(5, nil)))
	}), "commit: one compare-and-swap")

	calls := phase(ocs, "release and reclaim", func() {
		require.NoError(t, spate.ReleaseDrained(t.Context(), owner, id))
		gain(owner, ow, id)
	})
	if plain {
		// Release: the owner clear and the lease delete; claim: the lease
		// create and the compare-and-swap. On a real server a lease renewal
		// often lands between the owner clear and the lease delete: the
		// delete then loses, the worker reads the lease back (still its
		// own) and reclaims with the compare-and-swap alone, also four
		// calls besides the renewal.
		require.Len(t, calls, 4, "release and reclaim")
		assert.Equal(t, "update/durable", calls[0], "the release starts with the owner clear")
		assert.Contains(t, calls, "delete/ephemeral", "the release deletes the lease")
	} else {
		// Release: one call; claim: the lease create and the
		// compare-and-swap. The renewer stops before the release, but a
		// renewal already in flight may land first: the delete then loses
		// its guard and the plain delete (delete, read, delete) finishes
		// the release.
		require.NotEmpty(t, calls)
		assert.Equal(t, "update-and-delete/durable", calls[0], "the release is one call")
		if !slices.Contains(calls, "get/ephemeral") {
			assert.Equal(t, []string{"update-and-delete/durable", "create/ephemeral", "update/durable"}, calls,
				"release and reclaim: one call, then the claim's two")
		}
	}

	standby, scs, sw := start("standby")
	time.Sleep(ttl / 3) // let the standby join
	calls = phase(scs, "takeover", func() {
		require.NoError(t, owner.Abandon())
		gain(standby, sw, id)
	})
	assert.ElementsMatch(t, []string{"create/ephemeral", "update/durable"}, calls,
		"takeover: the lease create and the epoch-bumping compare-and-swap")
}
