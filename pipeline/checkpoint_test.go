package pipeline

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestDrainBarrier(t *testing.T) {
	t.Run("completes when every party arrives", func(t *testing.T) {
		b := NewDrainBarrier(2)
		b.Arrive()
		require.False(t, b.Wait(time.Millisecond), "barrier completed with a party missing")
		require.Equal(t, 1, b.Remaining(), "remaining = %d, want 1", b.Remaining())
		go b.Arrive()
		require.True(t, b.Wait(5*time.Second), "barrier did not complete after every party arrived")
		require.True(t, b.Wait(0), "waiting after completion must return true at once")
	})
	t.Run("zero parties is complete", func(t *testing.T) {
		require.True(t, NewDrainBarrier(0).Wait(0), "a zero-party barrier must be complete")
	})
	t.Run("extra arrivals are ignored", func(t *testing.T) {
		b := NewDrainBarrier(1)
		b.Arrive()
		b.Arrive()
		require.True(t, b.Done(), "barrier state broken by an extra arrival")
		require.Zero(t, b.Remaining(), "barrier state broken by an extra arrival")
	})
}

func TestAckRefResolvesExactlyOnceOnLastRelease(t *testing.T) {
	cp := NewCheckpointer(nil)
	require.NoError(t, cp.BeginEpoch([]PartitionID{0}, 1))
	a := cp.Issuer().Issue(0, 9)
	a.Clone()
	a.Clone()
	a.Release()
	a.Release()
	_, err := cp.drain()
	require.NoError(t, err)
	got := cp.TakeWatermarks()
	require.Empty(t, got, "watermark advanced before the last release: %v", got)
	a.Release()
	_, err = cp.drain()
	require.NoError(t, err)
	got = cp.TakeWatermarks()
	require.Len(t, got, 1, "watermarks = %v, want [{0 10}]", got)
	require.Equal(t, int64(10), got[0].Offset, "watermarks = %v, want [{0 10}]", got)
	require.Zero(t, cp.Unresolved(), "unresolved = %d after the last release", cp.Unresolved())
	require.Panics(t, a.Release, "a release past the last reference must panic")
}

func TestAckRefAnyFailurePoisonsTheBatch(t *testing.T) {
	cp := NewCheckpointer(nil)
	_ = cp.BeginEpoch([]PartitionID{0}, 1)
	a := cp.Issuer().Issue(0, 4)
	a.Clone()
	a.Abandon() // one holder lost its data
	a.Release() // the other delivered
	_, _ = cp.drain()
	got := cp.TakeWatermarks()
	require.Empty(t, got, "a failed batch advanced the watermark: %v", got)
	st := cp.StalledPartitions()
	require.Len(t, st, 1, "stalled = %v, want partition 0", st)
}

func TestAckSetDefaultsToFailure(t *testing.T) {
	cp := NewCheckpointer(nil)
	_ = cp.BeginEpoch([]PartitionID{0, 1}, 1)
	is := cp.Issuer()
	a, b := is.Issue(0, 0), is.Issue(1, 0)
	var delivered, abandoned AckSet
	delivered.AddOnce(a)
	delivered.AddOnce(a) // once per chunk
	abandoned.AddOnce(b)
	require.Equal(t, 1, delivered.Len(), "AddOnce held a batch twice")
	var moved AckSet
	moved.Absorb(&delivered)
	require.Zero(t, delivered.Len(), "Absorb must move every reference")
	require.Equal(t, 1, moved.Len(), "Absorb must move every reference")
	a.Release()
	b.Release()
	moved.Deliver()
	abandoned.Abandon()
	_, _ = cp.drain()
	got := cp.TakeWatermarks()
	require.Len(t, got, 1, "watermarks = %v, want only partition 0", got)
	require.Equal(t, PartitionID(0), got[0].Partition, "watermarks = %v, want only partition 0", got)
	require.Zero(t, cp.Unresolved(), "unresolved = %d", cp.Unresolved())
}

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
		tr.resolve(2, AckDelivered)
		tr.resolve(1, AckDelivered)
		_, _, moved := tr.advance(now)
		require.False(t, moved, "advanced past a pending head")
		tr.resolve(0, AckDelivered)
		off, retired, moved := tr.advance(now)
		require.True(t, moved, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
		require.Equal(t, int64(30), off, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
		require.Equal(t, uint64(3), retired, "advance = %d,%d,%v want 30,3,true", off, retired, moved)
	})
	t.Run("a failure at the head stalls for good and commits up to it", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19, 29)
		tr.resolve(0, AckDelivered)
		tr.resolve(1, AckFailed)
		tr.resolve(2, AckDelivered)
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
		tr.resolve(1, AckFailed)
		tr.advance(now)
		require.False(t, tr.stalled, "stalled before the failed batch reached the head")
		tr.resolve(0, AckDelivered)
		tr.advance(now)
		require.True(t, tr.stalled, "not stalled once the failed batch is the head")
	})
	t.Run("outcomes", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 0)
		require.Equal(t, resolveApplied, tr.resolve(0, AckDelivered), "applied then duplicate expected")
		require.Equal(t, resolveDuplicate, tr.resolve(0, AckDelivered), "applied then duplicate expected")
		tr.advance(now)
		require.Equal(t, resolveAlreadyAdvanced, tr.resolve(0, AckDelivered), "already advanced expected")
		require.Equal(t, resolveUnregistered, tr.resolve(5, AckDelivered), "unregistered expected")
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
			st := AckDelivered
			status[i] = 1
			if failed {
				st = AckFailed
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

func TestWatermarkController(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	p := newBPParams(100, 0.8, 0.5, 10*time.Millisecond)
	require.Equal(t, int64(80), p.high, "params %+v", p)
	require.Equal(t, int64(50), p.low, "params %+v", p)
	w := newWatermarkController(p, clock)
	require.Equal(t, bpNone, w.tick(79, true), "paused below the high mark")
	require.Equal(t, bpPause, w.tick(80, true), "the high mark must pause")
	require.Equal(t, bpNone, w.tick(10, true), "resumed before min pause")
	now = now.Add(10 * time.Millisecond)
	require.Equal(t, bpNone, w.tick(51, true), "resumed above the low mark or with full queues")
	require.Equal(t, bpNone, w.tick(50, false), "resumed above the low mark or with full queues")
	w.onSendRejected()
	require.Equal(t, bpNone, w.tick(0, true), "a rejection while paused must hold the pause one tick")
	require.Equal(t, bpNone, w.tick(0, true), "a rejection while paused restarts the min-pause timer")
	now = now.Add(10 * time.Millisecond)
	require.Equal(t, bpResume, w.tick(0, true), "must resume once low, queues low and min pause passed")
	w.onSendRejected()
	require.Equal(t, bpPause, w.tick(0, true), "a rejection pauses on the next tick")
}

func TestInflightBudgetSaturates(t *testing.T) {
	b := NewInflightBudget(10)
	b.Add(5)
	b.Sub(8)
	require.Zero(t, b.Usage(), "usage went below zero: %d", b.Usage())
}

func TestStopArithmetic(t *testing.T) {
	trigger := time.Unix(1000, 0)
	st := newStopTimes(trigger, 25*time.Second, DefaultStopReserve)
	require.True(t, st.deadline.Equal(trigger.Add(25*time.Second)), "stop times %+v", st)
	require.True(t, st.reserveAt.Equal(trigger.Add(20*time.Second)), "stop times %+v", st)
	short := newStopTimes(trigger, 3*time.Second, DefaultStopReserve)
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
