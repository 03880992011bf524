package pipeline

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// ackEvent is one message on the checkpointer's single acknowledgment queue:
// a batch registration or a batch resolution. Both travel on one queue, so
// a registration, which is pushed before its AckRef exists, always precedes
// the resolution of that AckRef.
type ackEvent struct {
	resolve bool
	id      batchID
	last    int64
	status  ackStatus
}

// ackHub is what issuers and AckRefs share with their checkpointer.
type ackHub struct {
	q     *mpsc[ackEvent]
	epoch atomic.Uint32
	// live counts AckRefs issued and not yet finally released: a leak
	// detector. A run that ends with live > 0 dropped a reference without
	// releasing it (the watermark stalls behind it: the safe direction).
	live atomic.Int64
}

// AckRef is the acknowledgment handle of one polled batch, reference
// counted explicitly because Go has no destructors.
//
// The issuer returns it holding one reference. Every holder of the batch's
// data (the batch itself, a chunk in a sink queue, a parked chunk) holds a
// reference: take one with [AckRef.Clone] and give it back exactly once with
// [AckRef.Release]. [AckRef.Fail] poisons the batch (any single failure wins
// and is idempotent). When the last reference is released, exactly one
// resolution — Delivered unless some holder failed it — reaches the
// checkpointer.
//
// Every path that drops data must Fail before it Releases: dropping a
// record by policy (a filter, a skip) is delivery, but losing it (an
// abandoned write, a torn-down queue, a chain that failed) is failure.
// Releasing more often than the references held panics; forgetting a
// Release leaves the batch pending forever, which stalls its partition's
// watermark (never a loss) and is counted by [Checkpointer.Unresolved].
type AckRef struct {
	id     batchID
	last   int64
	refs   atomic.Int64
	failed atomic.Bool
	hub    *ackHub
}

// ID is the batch's identity.
func (a *AckRef) ID() batchID { return a.id }

// LastOffset is the offset of the batch's last record.
func (a *AckRef) LastOffset() int64 { return a.last }

// Clone takes another reference and returns a. Cloning a fully released
// handle panics (a use after release).
func (a *AckRef) Clone() *AckRef {
	if a.refs.Add(1) <= 1 {
		panic(fmt.Sprintf("pipeline: AckRef %s cloned after its last release", a.id))
	}
	return a
}

// Fail marks the batch failed. It does not release the caller's reference.
func (a *AckRef) Fail() { a.failed.Store(true) }

// Failed reports whether some holder failed the batch.
func (a *AckRef) Failed() bool { return a.failed.Load() }

// Release gives back one reference. The last release resolves the batch.
func (a *AckRef) Release() {
	n := a.refs.Add(-1)
	if n > 0 {
		return
	}
	if n < 0 {
		panic(fmt.Sprintf("pipeline: AckRef %s released more often than it was held", a.id))
	}
	status := ackDelivered
	if a.failed.Load() {
		status = ackFailed
	}
	a.hub.live.Add(-1)
	a.hub.q.Push(ackEvent{resolve: true, id: a.id, last: a.last, status: status})
}

// Abandon fails the batch and releases the caller's reference: the one-call
// form of every data-dropping path.
func (a *AckRef) Abandon() {
	a.Fail()
	a.Release()
}

// AckIssuer mints batch handles. One issuer serves one producer context;
// within an assignment epoch every batch of a partition must come from the
// same issuer, because the sequence counters live here. A Clone starts with
// fresh counters. It is safe for concurrent use.
type AckIssuer struct {
	hub   *ackHub
	mu    sync.Mutex
	epoch uint32
	seqs  map[PartitionID]uint64
}

// Clone returns an issuer on the same checkpointer with fresh counters.
func (i *AckIssuer) Clone() *AckIssuer { return &AckIssuer{hub: i.hub} }

// Issue registers a new batch of partition p whose last record has offset
// lastOffset and returns its handle, holding one reference. The
// registration is queued before the handle exists, so the checkpointer
// always knows a batch before it sees it resolve. It never blocks.
func (i *AckIssuer) Issue(p PartitionID, lastOffset int64) *AckRef {
	epoch := i.hub.epoch.Load()
	i.mu.Lock()
	if epoch != i.epoch || i.seqs == nil {
		i.epoch = epoch
		i.seqs = make(map[PartitionID]uint64)
	}
	seq := i.seqs[p]
	i.seqs[p] = seq + 1
	i.mu.Unlock()
	id := batchID{Partition: p, Epoch: epoch, Seq: seq}
	i.hub.q.Push(ackEvent{id: id, last: lastOffset})
	a := &AckRef{id: id, last: lastOffset, hub: i.hub}
	a.refs.Store(1)
	i.hub.live.Add(1)
	return a
}

// ackSet holds one reference to each of a set of batches: the handles of
// an encoded chunk, a sink batch or a parked chunk. Its default is failure:
// only [ackSet.Deliver], after a durable write, delivers; every other way
// out calls [ackSet.Abandon]. An ackSet is not safe for concurrent use.
type ackSet struct {
	refs []*AckRef
}

// Add takes ownership of one reference of a (clone first to keep yours).
func (s *ackSet) Add(a *AckRef) { s.refs = append(s.refs, a) }

// AddOnce clones a into the set unless a is already its newest member: a
// chunk fed record by record from one batch holds that batch once.
func (s *ackSet) AddOnce(a *AckRef) {
	if n := len(s.refs); n > 0 && s.refs[n-1] == a {
		return
	}
	s.refs = append(s.refs, a.Clone())
}

// Absorb moves every reference of o into s, leaving o empty.
func (s *ackSet) Absorb(o *ackSet) {
	s.refs = append(s.refs, o.refs...)
	o.refs = nil
}

// Len is the number of references held.
func (s *ackSet) Len() int { return len(s.refs) }

// Deliver releases every reference as delivered and empties the set.
func (s *ackSet) Deliver() {
	for _, a := range s.refs {
		a.Release()
	}
	s.refs = nil
}

// Abandon fails and releases every reference and empties the set.
func (s *ackSet) Abandon() {
	for _, a := range s.refs {
		a.Abandon()
	}
	s.refs = nil
}
