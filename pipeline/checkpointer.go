package pipeline

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// pendingGate is the runner half of a partition's hard pending-batch
// ceiling: the assignment epoch the gate belongs to and the partition's
// advance counter, which the checkpointer bumps by the number of batches
// each watermark advance retires.
type pendingGate struct {
	Epoch    uint32
	Advanced *atomic.Uint64
	// Committed counts the partition's batches whose watermark the source
	// committed: the controller raises it when a commit lands. The runner's
	// uncommitted-bytes ceiling reads it.
	Committed *atomic.Uint64
}

// drainStats counts what one Checkpointer.drain applied and discarded.
type drainStats struct {
	registered, applied, duplicate, staleEpoch, unknown int
}

// Checkpointer turns batch registrations and resolutions into committable
// watermarks. It is owned by the controller and used from one goroutine;
// the issuers and handles it gives out are safe anywhere.
type Checkpointer struct {
	hub      *ackHub
	now      func() time.Time
	epoch    uint32
	begun    bool
	trackers map[PartitionID]*partitionTracker
	counters map[PartitionID]*atomic.Uint64
	commits  map[PartitionID]*atomic.Uint64 // batches committed, see pendingGate
	admitted map[PartitionID]bool           // partitions admitted this epoch, live or revoked
	scratch  []ackEvent
	deferred []ackEvent
}

// NewCheckpointer returns a checkpointer reading time from now (time.Now
// when nil).
func NewCheckpointer(now func() time.Time) *Checkpointer {
	if now == nil {
		now = time.Now
	}
	return &Checkpointer{
		hub:      &ackHub{q: newMPSC[ackEvent]()},
		now:      now,
		trackers: map[PartitionID]*partitionTracker{},
		counters: map[PartitionID]*atomic.Uint64{},
		commits:  map[PartitionID]*atomic.Uint64{},
		admitted: map[PartitionID]bool{},
	}
}

// Issuer returns a new issuer bound to this checkpointer.
func (c *Checkpointer) Issuer() *AckIssuer { return &AckIssuer{hub: c.hub} }

// Epoch is the current assignment epoch (0 before the first).
func (c *Checkpointer) Epoch() uint32 { return c.epoch }

// Now reads the checkpointer's clock.
func (c *Checkpointer) Now() time.Time { return c.now() }

// Unresolved counts handles issued and not yet finally released. After a
// run has drained, anything but zero is a leaked reference.
func (c *Checkpointer) Unresolved() int64 { return c.hub.live.Load() }

// BeginEpoch replaces every tracker with fresh ones for exactly partitions
// under epoch, then publishes the epoch to the issuers, so an issuer that
// sees the new epoch always finds a tracker. Call it before the new lanes
// reach any runner. Epochs strictly increase.
func (c *Checkpointer) BeginEpoch(partitions []PartitionID, epoch uint32) error {
	if c.begun && epoch <= c.epoch {
		return fatalf("checkpoint", "assignment epoch regressed: %d after %d", epoch, c.epoch)
	}
	c.begun = true
	c.epoch = epoch
	c.trackers = make(map[PartitionID]*partitionTracker, len(partitions))
	c.counters = make(map[PartitionID]*atomic.Uint64, len(partitions))
	c.commits = make(map[PartitionID]*atomic.Uint64, len(partitions))
	c.admitted = make(map[PartitionID]bool, len(partitions))
	for _, p := range partitions {
		c.trackers[p] = &partitionTracker{}
		c.counters[p] = new(atomic.Uint64)
		c.commits[p] = new(atomic.Uint64)
		c.admitted[p] = true
	}
	c.hub.epoch.Store(epoch)
	return nil
}

// ExtendEpoch admits partitions into the current epoch. A partition
// already admitted in this epoch, live or revoked, is rejected and nothing
// changes. Call it before the lanes are distributed.
func (c *Checkpointer) ExtendEpoch(partitions []PartitionID) error {
	for _, p := range partitions {
		if c.admitted[p] {
			how := "is already tracked"
			if c.trackers[p] == nil {
				how = "was revoked earlier in this epoch"
			}
			return fatalf("checkpoint", "additive assignment reused partition %d which %s (epoch %d); a partition returns only in a new epoch", p, how, c.epoch)
		}
	}
	for _, p := range partitions {
		c.trackers[p] = &partitionTracker{}
		c.counters[p] = new(atomic.Uint64)
		c.commits[p] = new(atomic.Uint64)
		c.admitted[p] = true
	}
	return nil
}

// Revoke drops the partitions' trackers and counters; their later
// registrations and resolutions are discarded as stale.
func (c *Checkpointer) Revoke(partitions []PartitionID) {
	for _, p := range partitions {
		delete(c.trackers, p)
		delete(c.counters, p)
		delete(c.commits, p)
	}
}

// Tracks reports whether p has a live tracker.
func (c *Checkpointer) Tracks(p PartitionID) bool { return c.trackers[p] != nil }

// Gate returns the pending gate of p in the current epoch.
func (c *Checkpointer) Gate(p PartitionID) (pendingGate, bool) {
	ctr := c.counters[p]
	if ctr == nil {
		return pendingGate{}, false
	}
	return pendingGate{Epoch: c.epoch, Advanced: ctr, Committed: c.commits[p]}, true
}

// commitMark is how far a partition's batches had advanced when its
// watermark was taken: once a commit of that watermark lands, n is stored
// (by max) into ctr, the partition's [pendingGate.Committed].
type commitMark struct {
	ctr *atomic.Uint64
	n   uint64
}

func (m commitMark) landed() {
	if m.ctr == nil {
		return
	}
	for {
		cur := m.ctr.Load()
		if cur >= m.n || m.ctr.CompareAndSwap(cur, m.n) {
			return
		}
	}
}

// mark is p's current commit mark (zero when p is not tracked).
func (c *Checkpointer) mark(p PartitionID) commitMark {
	ctr := c.counters[p]
	if ctr == nil {
		return commitMark{}
	}
	return commitMark{ctr: c.commits[p], n: ctr.Load()}
}

// drain applies every queued registration and resolution. A registration
// gap is a source bug that would corrupt accounting: it is returned as a
// fatal error.
func (c *Checkpointer) drain() (drainStats, error) {
	var st drainStats
	var firstErr error
	c.scratch = c.hub.q.DrainInto(c.scratch[:0])
	c.deferred = c.deferred[:0]
	for _, ev := range c.scratch {
		if err := c.apply(ev, &st, true); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if len(c.deferred) > 0 {
		// A resolution overtook its registration: registrations queued since
		// then are applied first, then the deferred resolutions once more.
		retry := append([]ackEvent(nil), c.deferred...)
		c.deferred = c.deferred[:0]
		c.scratch = c.hub.q.DrainInto(c.scratch[:0])
		var later []ackEvent
		for _, ev := range c.scratch {
			if ev.resolve {
				later = append(later, ev)
				continue
			}
			if err := c.apply(ev, &st, false); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		for _, ev := range append(retry, later...) {
			_ = c.apply(ev, &st, false)
		}
		st.unknown += len(c.deferred)
		c.deferred = c.deferred[:0]
	}
	clear(c.scratch)
	return st, firstErr
}

func (c *Checkpointer) apply(ev ackEvent, st *drainStats, canDefer bool) error {
	t := c.trackers[ev.id.Partition]
	if ev.id.Epoch != c.epoch || t == nil {
		st.staleEpoch++
		return nil
	}
	if !ev.resolve {
		st.registered++
		if err := t.register(ev.id.Seq, ev.last); err != nil {
			return fatalf("checkpoint", "partition %d: %v", ev.id.Partition, err)
		}
		return nil
	}
	switch t.resolve(ev.id.Seq, ev.status) {
	case resolveApplied:
		st.applied++
	case resolveDuplicate, resolveAlreadyAdvanced:
		st.duplicate++
	case resolveUnregistered:
		c.deferred = append(c.deferred, ev)
		if !canDefer {
			// Counted as unknown by the caller.
			return nil
		}
	}
	return nil
}

// TakeWatermarks advances every tracker and returns the partitions whose
// watermark moved, sorted by partition; retired batches are added to each
// partition's advance counter.
func (c *Checkpointer) TakeWatermarks() []Watermark {
	now := c.now()
	var out []Watermark
	for p, t := range c.trackers {
		off, retired, moved := t.advance(now)
		if retired > 0 {
			c.counters[p].Add(retired)
		}
		if moved {
			out = append(out, Watermark{Partition: p, Offset: off})
		}
	}
	slices.SortFunc(out, func(a, b Watermark) int { return cmp.Compare(a.Partition, b.Partition) })
	return out
}

// MaxPending is the largest pending-batch count over tracked partitions.
func (c *Checkpointer) MaxPending() int {
	m := 0
	for _, t := range c.trackers {
		m = max(m, t.pending())
	}
	return m
}

// pendingByPartition lists every tracked partition's pending count, sorted.
func (c *Checkpointer) pendingByPartition() []partitionCount {
	out := make([]partitionCount, 0, len(c.trackers))
	for p, t := range c.trackers {
		out = append(out, partitionCount{Partition: p, N: t.pending()})
	}
	slices.SortFunc(out, func(a, b partitionCount) int { return cmp.Compare(a.Partition, b.Partition) })
	return out
}

// partitionCount is a per-partition count.
type partitionCount struct {
	Partition PartitionID
	N         int
}

// stalledPartition is a partition whose watermark is stuck behind a failed
// batch, and since when.
type stalledPartition struct {
	Partition PartitionID
	Since     time.Time
}

// stalledPartitions lists every stalled tracker, sorted by partition.
func (c *Checkpointer) stalledPartitions() []stalledPartition {
	var out []stalledPartition
	for p, t := range c.trackers {
		if t.stalled {
			out = append(out, stalledPartition{Partition: p, Since: t.stalledSince})
		}
	}
	slices.SortFunc(out, func(a, b stalledPartition) int { return cmp.Compare(a.Partition, b.Partition) })
	return out
}

func (st drainStats) String() string {
	return fmt.Sprintf("registered=%d applied=%d duplicate=%d stale=%d unknown=%d",
		st.registered, st.applied, st.duplicate, st.staleEpoch, st.unknown)
}
