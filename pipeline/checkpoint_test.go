package pipeline

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func TestCheckpointer(t *testing.T) {
	t.Run("advance counters count retired batches and are fresh per epoch", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		is := cp.Issuer()
		for i := range 3 {
			is.Issue(0, int64(i)).Release()
		}
		_, _ = cp.drain()
		cp.TakeWatermarks()
		g, _ := cp.Gate(0)
		require.Equal(t, uint64(3), g.Advanced.Load(), "advanced = %d epoch %d", g.Advanced.Load(), g.Epoch)
		require.Equal(t, uint32(1), g.Epoch, "advanced = %d epoch %d", g.Advanced.Load(), g.Epoch)
		_ = cp.BeginEpoch([]PartitionID{0}, 2)
		g2, _ := cp.Gate(0)
		require.Zero(t, g2.Advanced.Load(), "a new epoch must bring fresh counters")
		require.NotSame(t, g.Advanced, g2.Advanced, "a new epoch must bring fresh counters")
	})
	t.Run("take watermarks is empty until progress and after", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0, 1}, 1)
		require.Empty(t, cp.TakeWatermarks(), "watermarks before any ack")
		is := cp.Issuer()
		a0, a1 := is.Issue(0, 5), is.Issue(1, 7)
		a1.Release()
		a0.Release()
		_, _ = cp.drain()
		got := cp.TakeWatermarks()
		require.Equal(t, []Watermark{{0, 6}, {1, 8}}, got, "watermarks = %v", got)
		require.Empty(t, cp.TakeWatermarks(), "a second take must be empty")
	})
	t.Run("stale epoch acks are discarded", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		old := cp.Issuer().Issue(0, 100)
		_ = cp.BeginEpoch([]PartitionID{0}, 2)
		old.Release()
		st, _ := cp.drain()
		require.Equal(t, 2, st.staleEpoch, "stale = %d, want registration and resolution", st.staleEpoch)
		require.Empty(t, cp.TakeWatermarks(), "a stale ack advanced a new epoch's watermark")
	})
	t.Run("a mid-flight revoke discards later acks", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		a := cp.Issuer().Issue(0, 1)
		_, _ = cp.drain()
		cp.Revoke([]PartitionID{0})
		a.Release()
		st, _ := cp.drain()
		require.Equal(t, 1, st.staleEpoch, "stats %v", st)
		require.False(t, cp.Tracks(0), "stats %v", st)
	})
	t.Run("extend keeps in-flight acks and rejects reuse", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		a := cp.Issuer().Issue(0, 3)
		require.NoError(t, cp.ExtendEpoch([]PartitionID{1}))
		a.Release()
		_, _ = cp.drain()
		got := cp.TakeWatermarks()
		require.Len(t, got, 1, "in-flight ack lost by extend: %v", got)
		require.Equal(t, int64(4), got[0].Offset, "in-flight ack lost by extend: %v", got)
		require.Error(t, cp.ExtendEpoch([]PartitionID{2, 1}), "extend must reject a live partition")
		require.False(t, cp.Tracks(2), "a rejected extend must change nothing")
		cp.Revoke([]PartitionID{1})
		require.Error(t, cp.ExtendEpoch([]PartitionID{1}), "extend must reject a partition revoked in this epoch")
		require.Equal(t, uint32(1), cp.Epoch(), "extend changed the epoch")
	})
	t.Run("an epoch regression is an error", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch(nil, 3)
		require.Error(t, cp.BeginEpoch(nil, 3), "an equal epoch must be rejected")
	})
	t.Run("cross-goroutine issuing", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		parts := []PartitionID{0, 1, 2, 3}
		_ = cp.BeginEpoch(parts, 1)
		var wg sync.WaitGroup
		for _, p := range parts {
			is := cp.Issuer()
			wg.Go(func() {
				for i := range 50 {
					a := is.Issue(p, int64(i))
					go a.Release()
				}
			})
		}
		wg.Wait()
		deadline := time.Now().Add(5 * time.Second)
		applied := 0
		for applied < 200 && time.Now().Before(deadline) {
			st, err := cp.drain()
			require.NoError(t, err, "drain: %v", st)
			require.Zero(t, st.unknown, "drain: %v %v", err, st)
			applied += st.applied
			time.Sleep(time.Millisecond)
		}
		require.Equal(t, 200, applied, "applied %d of 200", applied)
	})
}

// Epoch churn never lets a stale acknowledgment move a watermark: every
// committed offset is covered by a delivered batch of the current epoch.
func TestCheckpointerEpochChurn(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cp := NewCheckpointer(nil)
		epoch := uint32(1)
		_ = cp.BeginEpoch([]PartitionID{0, 1}, epoch)
		is := cp.Issuer()
		type held struct {
			a     *AckRef
			epoch uint32
		}
		var live []held
		delivered := map[PartitionID]map[int64]uint32{0: {}, 1: {}} // offset+1 -> epoch
		next := int64(0)
		for range rapid.IntRange(1, 80).Draw(t, "steps") {
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1:
				p := PartitionID(rapid.IntRange(0, 1).Draw(t, "p"))
				live = append(live, held{is.Issue(p, next), epoch})
				next++
			case 2:
				if len(live) > 0 {
					i := rapid.IntRange(0, len(live)-1).Draw(t, "i")
					h := live[i]
					live = append(live[:i], live[i+1:]...)
					delivered[h.a.ID().Partition][h.a.LastOffset()+1] = h.epoch
					h.a.Release()
				}
			case 3:
				epoch++
				_ = cp.BeginEpoch([]PartitionID{0, 1}, epoch)
			case 4:
				_, _ = cp.drain()
				for _, w := range cp.TakeWatermarks() {
					e, ok := delivered[w.Partition][w.Offset]
					require.True(t, ok, "watermark %v not backed by a delivered batch of epoch %d (got epoch %d, %v)", w, epoch, e, ok)
					require.Equal(t, epoch, e, "watermark %v not backed by a delivered batch of epoch %d (got epoch %d, %v)", w, epoch, e, ok)
				}
			}
		}
		for _, h := range live {
			h.a.Release()
		}
	})
}

func TestStopArithmetic(t *testing.T) {
	trigger := time.Unix(1000, 0)
	st := newStopTimes(trigger, 25*time.Second, defaultStopReserve)
	require.True(t, st.deadline.Equal(trigger.Add(25*time.Second)), "stop times %+v", st)
	require.True(t, st.reserveAt.Equal(trigger.Add(20*time.Second)), "stop times %+v", st)
	short := newStopTimes(trigger, 3*time.Second, defaultStopReserve)
	require.True(t, short.reserveAt.Equal(trigger), "the reserve never precedes the trigger")
	now := trigger
	require.Equal(t, 4*time.Second, stopBudget(now, now.Add(4*time.Second), 10*time.Second), "stop budget")
	require.Equal(t, 10*time.Second, stopBudget(now, now.Add(20*time.Second), 10*time.Second), "stop budget")
	require.Zero(t, stopBudget(now.Add(time.Minute), now, time.Second), "stop budget")
	dl := now.Add(10 * time.Second)
	require.True(t, lanesDeadline(now, dl, time.Second).Equal(dl.Add(-time.Second)), "lanes deadline")
	require.True(t, lanesDeadline(now, dl, 0).Equal(dl), "lanes deadline")
	late := dl.Add(-500 * time.Millisecond)
	require.True(t, lanesDeadline(late, dl, time.Second).Equal(late), "lanes deadline never before now")
}
