package spate

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAWorkersScopeIsWhatItIsAssignedHoldsOrHandsBack(t *testing.T) {
	wk := testWorker(t)
	wk.assigned["a"] = true
	wk.owned["h"] = &tenancy{epoch: 3}
	wk.handingBack["b"] = 1
	wk.handingBack["done"] = 0 // a hand-back that ended

	for _, id := range []string{"a", "h", "b"} {
		assert.True(t, wk.inScope(id), id)
	}
	for _, id := range []string{"done", "other", ""} {
		assert.False(t, wk.inScope(id), id)
	}
}

func TestAdoptingAnInstructionTracksWhatIsAwaited(t *testing.T) {
	wk := testWorker(t)
	wk.owned["held"] = &tenancy{}
	t0 := time.Unix(100, 0)

	require.True(t, wk.adopt(&assignmentVal{Generation: 2, Splits: []string{"held", "x", "y"}}, t0))
	assert.True(t, wk.assignSeen)
	assert.True(t, wk.ownDirty)
	assert.Equal(t, uint64(2), wk.assignGen)
	assert.Equal(t, map[string]bool{"held": true, "x": true, "y": true}, wk.assigned)
	assert.Equal(t, map[string]time.Time{"x": t0, "y": t0}, wk.awaiting, "a held split is not awaited")

	// The next instruction keeps a split's first wait and drops what it
	// no longer names.
	t1 := t0.Add(time.Second)
	wk.ownDirty = false
	require.True(t, wk.adopt(&assignmentVal{Generation: 2, Splits: []string{"x", "z"}}, t1))
	assert.Equal(t, map[string]time.Time{"x": t0, "z": t1}, wk.awaiting)
	assert.True(t, wk.ownDirty)
}

func TestAnOlderGenerationsInstructionIsRefused(t *testing.T) {
	wk := testWorker(t)
	require.True(t, wk.adopt(&assignmentVal{Generation: 5, Splits: []string{"a"}}, time.Now()))
	wk.ownDirty = false

	assert.False(t, wk.adopt(&assignmentVal{Generation: 4, Splits: []string{"b"}}, time.Now()))
	assert.Equal(t, map[string]bool{"a": true}, wk.assigned, "a deposed leader's late write changes nothing")
	assert.Equal(t, uint64(5), wk.assignGen)
	assert.False(t, wk.ownDirty)

	// Before any instruction was seen, any generation is taken.
	wk.forget()
	assert.False(t, wk.assignSeen)
	assert.Empty(t, wk.assigned)
	assert.Empty(t, wk.awaiting)
	assert.True(t, wk.adopt(&assignmentVal{Generation: 1, Splits: []string{"c"}}, time.Now()))
	assert.Equal(t, map[string]bool{"c": true}, wk.assigned)
}

func testWorker(t *testing.T) worker {
	t.Helper()
	m, err := newCoordMetrics(prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	return newWorker(m, slog.New(slog.DiscardHandler))
}
