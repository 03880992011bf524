package pipeline

import (
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestDrainBarrier(t *testing.T) {
	t.Run("completes when every party arrives", func(t *testing.T) {
		b := NewDrainBarrier(2)
		b.Arrive()
		if b.Wait(time.Millisecond) {
			t.Fatal("barrier completed with a party missing")
		}
		if b.Remaining() != 1 {
			t.Fatalf("remaining = %d, want 1", b.Remaining())
		}
		go b.Arrive()
		if !b.Wait(5 * time.Second) {
			t.Fatal("barrier did not complete after every party arrived")
		}
		if !b.Wait(0) {
			t.Fatal("waiting after completion must return true at once")
		}
	})
	t.Run("zero parties is complete", func(t *testing.T) {
		if !NewDrainBarrier(0).Wait(0) {
			t.Fatal("a zero-party barrier must be complete")
		}
	})
	t.Run("extra arrivals are ignored", func(t *testing.T) {
		b := NewDrainBarrier(1)
		b.Arrive()
		b.Arrive()
		if !b.Done() || b.Remaining() != 0 {
			t.Fatal("barrier state broken by an extra arrival")
		}
	})
}

func TestAckRefResolvesExactlyOnceOnLastRelease(t *testing.T) {
	cp := NewCheckpointer(nil)
	if err := cp.BeginEpoch([]PartitionID{0}, 1); err != nil {
		t.Fatal(err)
	}
	a := cp.Issuer().Issue(0, 9)
	a.Clone()
	a.Clone()
	a.Release()
	a.Release()
	if _, err := cp.drain(); err != nil {
		t.Fatal(err)
	}
	if got := cp.TakeWatermarks(); len(got) != 0 {
		t.Fatalf("watermark advanced before the last release: %v", got)
	}
	a.Release()
	if _, err := cp.drain(); err != nil {
		t.Fatal(err)
	}
	if got := cp.TakeWatermarks(); len(got) != 1 || got[0].Offset != 10 {
		t.Fatalf("watermarks = %v, want [{0 10}]", got)
	}
	if cp.Unresolved() != 0 {
		t.Fatalf("unresolved = %d after the last release", cp.Unresolved())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a release past the last reference must panic")
		}
	}()
	a.Release()
}

func TestAckRefAnyFailurePoisonsTheBatch(t *testing.T) {
	cp := NewCheckpointer(nil)
	_ = cp.BeginEpoch([]PartitionID{0}, 1)
	a := cp.Issuer().Issue(0, 4)
	a.Clone()
	a.Abandon() // one holder lost its data
	a.Release() // the other delivered
	_, _ = cp.drain()
	if got := cp.TakeWatermarks(); len(got) != 0 {
		t.Fatalf("a failed batch advanced the watermark: %v", got)
	}
	if st := cp.StalledPartitions(); len(st) != 1 {
		t.Fatalf("stalled = %v, want partition 0", st)
	}
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
	if delivered.Len() != 1 {
		t.Fatalf("AddOnce held a batch twice")
	}
	var moved AckSet
	moved.Absorb(&delivered)
	if delivered.Len() != 0 || moved.Len() != 1 {
		t.Fatal("Absorb must move every reference")
	}
	a.Release()
	b.Release()
	moved.Deliver()
	abandoned.Abandon()
	_, _ = cp.drain()
	got := cp.TakeWatermarks()
	if len(got) != 1 || got[0].Partition != 0 {
		t.Fatalf("watermarks = %v, want only partition 0", got)
	}
	if cp.Unresolved() != 0 {
		t.Fatalf("unresolved = %d", cp.Unresolved())
	}
}

func TestTracker(t *testing.T) {
	now := time.Unix(100, 0)
	reg := func(tr *partitionTracker, offs ...int64) {
		for _, o := range offs {
			if err := tr.register(tr.nextSeq, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("out of order waits for the head", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19, 29)
		tr.resolve(2, AckDelivered)
		tr.resolve(1, AckDelivered)
		if _, _, moved := tr.advance(now); moved {
			t.Fatal("advanced past a pending head")
		}
		tr.resolve(0, AckDelivered)
		off, retired, moved := tr.advance(now)
		if !moved || off != 30 || retired != 3 {
			t.Fatalf("advance = %d,%d,%v want 30,3,true", off, retired, moved)
		}
	})
	t.Run("a failure at the head stalls for good and commits up to it", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19, 29)
		tr.resolve(0, AckDelivered)
		tr.resolve(1, AckFailed)
		tr.resolve(2, AckDelivered)
		off, _, moved := tr.advance(now)
		if !moved || off != 10 || !tr.stalled {
			t.Fatalf("advance = %d,%v stalled=%v; want 10,true,true", off, moved, tr.stalled)
		}
		if _, _, moved := tr.advance(now.Add(time.Hour)); moved || !tr.stalledSince.Equal(now) {
			t.Fatal("a stall must be permanent and keep its first time")
		}
	})
	t.Run("a failure behind a pending batch stalls only at the head", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 9, 19)
		tr.resolve(1, AckFailed)
		tr.advance(now)
		if tr.stalled {
			t.Fatal("stalled before the failed batch reached the head")
		}
		tr.resolve(0, AckDelivered)
		tr.advance(now)
		if !tr.stalled {
			t.Fatal("not stalled once the failed batch is the head")
		}
	})
	t.Run("outcomes", func(t *testing.T) {
		var tr partitionTracker
		reg(&tr, 0)
		if tr.resolve(0, AckDelivered) != resolveApplied || tr.resolve(0, AckDelivered) != resolveDuplicate {
			t.Fatal("applied then duplicate expected")
		}
		tr.advance(now)
		if tr.resolve(0, AckDelivered) != resolveAlreadyAdvanced {
			t.Fatal("already advanced expected")
		}
		if tr.resolve(5, AckDelivered) != resolveUnregistered {
			t.Fatal("unregistered expected")
		}
		if err := tr.register(7, 0); err == nil {
			t.Fatal("a registration gap must be an error")
		}
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
			if err := tr.register(uint64(i), int64(i*10+9)); err != nil {
				t.Fatal(err)
			}
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
					if off < last {
						t.Fatalf("watermark regressed %d -> %d", last, off)
					}
					last = off
				}
				if last != want && !(want == -1 && last == -1) {
					t.Fatalf("watermark %d, model %d (statuses %v)", last, want, status)
				}
				stalledModel := prefix < n && status[prefix] == 2
				if tr.stalled != stalledModel {
					t.Fatalf("stalled %v, model %v", tr.stalled, stalledModel)
				}
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
		if g.Advanced.Load() != 3 || g.Epoch != 1 {
			t.Fatalf("advanced = %d epoch %d", g.Advanced.Load(), g.Epoch)
		}
		_ = cp.BeginEpoch([]PartitionID{0}, 2)
		g2, _ := cp.Gate(0)
		if g2.Advanced.Load() != 0 || g2.Advanced == g.Advanced {
			t.Fatal("a new epoch must bring fresh counters")
		}
	})
	t.Run("take watermarks is empty until progress and after", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0, 1}, 1)
		if len(cp.TakeWatermarks()) != 0 {
			t.Fatal("watermarks before any ack")
		}
		is := cp.Issuer()
		a0, a1 := is.Issue(0, 5), is.Issue(1, 7)
		a1.Release()
		a0.Release()
		_, _ = cp.drain()
		got := cp.TakeWatermarks()
		if len(got) != 2 || got[0] != (Watermark{0, 6}) || got[1] != (Watermark{1, 8}) {
			t.Fatalf("watermarks = %v", got)
		}
		if len(cp.TakeWatermarks()) != 0 {
			t.Fatal("a second take must be empty")
		}
	})
	t.Run("stale epoch acks are discarded", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		old := cp.Issuer().Issue(0, 100)
		_ = cp.BeginEpoch([]PartitionID{0}, 2)
		old.Release()
		st, _ := cp.drain()
		if st.staleEpoch != 2 {
			t.Fatalf("stale = %d, want registration and resolution", st.staleEpoch)
		}
		if len(cp.TakeWatermarks()) != 0 {
			t.Fatal("a stale ack advanced a new epoch's watermark")
		}
	})
	t.Run("a mid-flight revoke discards later acks", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		a := cp.Issuer().Issue(0, 1)
		_, _ = cp.drain()
		cp.Revoke([]PartitionID{0})
		a.Release()
		st, _ := cp.drain()
		if st.staleEpoch != 1 || cp.Tracks(0) {
			t.Fatalf("stats %v", st)
		}
	})
	t.Run("extend keeps in-flight acks and rejects reuse", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch([]PartitionID{0}, 1)
		a := cp.Issuer().Issue(0, 3)
		if err := cp.ExtendEpoch([]PartitionID{1}); err != nil {
			t.Fatal(err)
		}
		a.Release()
		_, _ = cp.drain()
		if got := cp.TakeWatermarks(); len(got) != 1 || got[0].Offset != 4 {
			t.Fatalf("in-flight ack lost by extend: %v", got)
		}
		if err := cp.ExtendEpoch([]PartitionID{2, 1}); err == nil {
			t.Fatal("extend must reject a live partition")
		}
		if cp.Tracks(2) {
			t.Fatal("a rejected extend must change nothing")
		}
		cp.Revoke([]PartitionID{1})
		if err := cp.ExtendEpoch([]PartitionID{1}); err == nil {
			t.Fatal("extend must reject a partition revoked in this epoch")
		}
		if cp.Epoch() != 1 {
			t.Fatal("extend changed the epoch")
		}
	})
	t.Run("an epoch regression is an error", func(t *testing.T) {
		cp := NewCheckpointer(nil)
		_ = cp.BeginEpoch(nil, 3)
		if err := cp.BeginEpoch(nil, 3); err == nil {
			t.Fatal("an equal epoch must be rejected")
		}
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
			if err != nil || st.unknown != 0 {
				t.Fatalf("drain: %v %v", err, st)
			}
			applied += st.applied
			time.Sleep(time.Millisecond)
		}
		if applied != 200 {
			t.Fatalf("applied %d of 200", applied)
		}
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
					if e, ok := delivered[w.Partition][w.Offset]; !ok || e != epoch {
						t.Fatalf("watermark %v not backed by a delivered batch of epoch %d (got epoch %d, %v)", w, epoch, e, ok)
					}
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
	if p.high != 80 || p.low != 50 {
		t.Fatalf("params %+v", p)
	}
	w := newWatermarkController(p, clock)
	if w.tick(79, true) != bpNone {
		t.Fatal("paused below the high mark")
	}
	if w.tick(80, true) != bpPause {
		t.Fatal("the high mark must pause")
	}
	if w.tick(10, true) != bpNone {
		t.Fatal("resumed before min pause")
	}
	now = now.Add(10 * time.Millisecond)
	if w.tick(51, true) != bpNone || w.tick(50, false) != bpNone {
		t.Fatal("resumed above the low mark or with full queues")
	}
	w.onSendRejected()
	if w.tick(0, true) != bpNone {
		t.Fatal("a rejection while paused must hold the pause one tick")
	}
	if w.tick(0, true) != bpNone {
		t.Fatal("a rejection while paused restarts the min-pause timer")
	}
	now = now.Add(10 * time.Millisecond)
	if w.tick(0, true) != bpResume {
		t.Fatal("must resume once low, queues low and min pause passed")
	}
	w.onSendRejected()
	if w.tick(0, true) != bpPause {
		t.Fatal("a rejection pauses on the next tick")
	}
}

func TestInflightBudgetSaturates(t *testing.T) {
	b := NewInflightBudget(10)
	b.Add(5)
	b.Sub(8)
	if b.Usage() != 0 {
		t.Fatalf("usage went below zero: %d", b.Usage())
	}
}

func TestStopArithmetic(t *testing.T) {
	trigger := time.Unix(1000, 0)
	st := newStopTimes(trigger, 25*time.Second, DefaultStopReserve)
	if !st.deadline.Equal(trigger.Add(25*time.Second)) || !st.reserveAt.Equal(trigger.Add(20*time.Second)) {
		t.Fatalf("stop times %+v", st)
	}
	short := newStopTimes(trigger, 3*time.Second, DefaultStopReserve)
	if !short.reserveAt.Equal(trigger) {
		t.Fatal("the reserve never precedes the trigger")
	}
	now := trigger
	if stopBudget(now, now.Add(4*time.Second), 10*time.Second) != 4*time.Second ||
		stopBudget(now, now.Add(20*time.Second), 10*time.Second) != 10*time.Second ||
		stopBudget(now.Add(time.Minute), now, time.Second) != 0 {
		t.Fatal("stop budget")
	}
	dl := now.Add(10 * time.Second)
	if !lanesDeadline(now, dl, time.Second).Equal(dl.Add(-time.Second)) || !lanesDeadline(now, dl, 0).Equal(dl) {
		t.Fatal("lanes deadline")
	}
	late := dl.Add(-500 * time.Millisecond)
	if !lanesDeadline(late, dl, time.Second).Equal(late) {
		t.Fatal("lanes deadline never before now")
	}
}
