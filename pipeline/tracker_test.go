package pipeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestTracker(t *testing.T) {
	now := time.Unix(100, 0)
	reg := func(tr *partitionTracker, offs ...int64) {
		for _, o := range offs {
			require.NoError(t, tr.register(tr.nextSeq, o))
		}
	}
	t.Run("out of order waits for the head", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19, 29)
		tr.resolve(2, ackDelivered)
		tr.resolve(1, ackDelivered)
		_, _, moved := tr.advance(now)
		require.False(t, moved, "advanced past a pending head")
		tr.resolve(0, ackDelivered)
		off, retired, moved := tr.advance(now)
		require.True(t, moved, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
		require.Equal(t, int64(30), off, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
		require.Equal(t, uint64(3), retired, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
	})
	t.Run("a failure at the head stalls for good and commits up to it", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19, 29)
		tr.resolve(0, ackDelivered)
		tr.resolve(1, ackFailed)
		tr.resolve(2, ackDelivered)
		off, _, moved := tr.advance(now)
		require.True(t, moved, "advance = %d,%v stalled=%v; want 10,true,true", off, moved, tr.stalled)
		require.Equal(t, int64(10), off, "advance = %d,%v stalled=%v; want 10,true,true", off, moved, tr.stalled)
		require.True(t, tr.stalled, "advance = %d,%v stalled=%v; want 10,true,true", off, moved, tr.stalled)
		_, _, moved = tr.advance(now.Add(time.Hour))
		require.False(t, moved, "a stall must be permanent and keep its first time")
		require.True(t, tr.stalledSince.Equal(now), "a stall must be permanent and keep its first time")
	})
	t.Run("a failure behind a pending batch stalls only at the head", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19)
		tr.resolve(1, ackFailed)
		tr.advance(now)
		require.False(t, tr.stalled, "stalled before the failed batch reached the head")
		tr.resolve(0, ackDelivered)
		tr.advance(now)
		require.True(t, tr.stalled, "not stalled once the failed batch is the head")
	})
	t.Run("outcomes", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 0)
		require.Equal(t, resolveApplied, tr.resolve(0, ackDelivered), "applied then duplicate expected")
		require.Equal(t, resolveDuplicate, tr.resolve(0, ackDelivered), "applied then duplicate expected")
		tr.advance(now)
		require.Equal(t, resolveAlreadyAdvanced, tr.resolve(0, ackDelivered), "already advanced expected")
		require.Equal(t, resolveUnregistered, tr.resolve(5, ackDelivered), "unregistered expected")
		require.Error(t, tr.register(7, 0), "a registration gap must be an error")
	})
}

// The tracker against a reference model: the watermark is last+1 of the
// longest delivered prefix, never passes a failed batch, never decreases.
func TestTrackerMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 60).Draw(t, "n")
		var tr partitionTracker
		status := make([]int, n) // 0 pending, 1 delivered, 2 failed
		for i := range n {
			require.NoError(t, tr.register(uint64(i), int64(i*10+9)))
		}
		order := rapid.Permutation(seq(n)).Draw(t, "order")
		var last int64 = -1
		for step, i := range order {
			failed := rapid.IntRange(0, 9).Draw(t, "fail") == 0
			st := ackDelivered
			status[i] = 1
			if failed {
				st = ackFailed
				status[i] = 2
			}
			tr.resolve(uint64(i), st)
			if rapid.Bool().Draw(t, "advance") || step == n-1 {
				off, _, moved := tr.advance(time.Time{})
				// model
				prefix := 0
				for prefix < n && status[prefix] == 1 {
					prefix++
				}
				want := int64(-1)
				if prefix > 0 {
					want = int64((prefix-1)*10 + 9 + 1)
				}
				if moved {
					require.GreaterOrEqual(t, off, last, "watermark regressed %d -> %d", last, off)
					last = off
				}
				require.Equal(t, want, last, "watermark %d, model %d (statuses %v)", last, want, status)
				stalledModel := prefix < n && status[prefix] == 2
				require.Equal(t, stalledModel, tr.stalled, "stalled %v, model %v", tr.stalled, stalledModel)
			}
		}
	})
}
