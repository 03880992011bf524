package spate

import (
	"context"
	"sync"
	"time"
)

// The fenced commit on the committing goroutine.
//
// A commit is one compare-and-swap on the split's progress record at the
// revision this worker last saw. Taken through the loop it costs four
// hand-offs (caller → loop → I/O goroutine → loop → caller), and at a
// round trip of a few hundred microseconds those hand-offs, not the store,
// bound a worker's commit rate. So each held split has a fence cell that
// the committing goroutine uses itself: it reserves the cell, writes, and
// records the new revision, and only then tells the loop (without waiting)
// so that the view, revocations and metrics follow. The loop stays the
// owner of every decision: it opens a cell when a claim lands, closes it
// when the tenancy ends, and reserves it for its own writes on the split
// (fail, release, a forced revocation), so writes on one split stay one at
// a time and each fences on the revision its predecessor left.
//
// Everything out of the ordinary takes the loop's path: a completing
// commit (it ends the tenancy), a watermark below the one seen (it needs
// the re-read), an epoch that is not the held one, a cell reserved by
// the loop, and every commit whose compare-and-swap did not win.

// fenceCell is one held split's commit fence, shared by the loop and the
// committing goroutine.
type fenceCell struct {
	mu   sync.Mutex
	open bool // the tenancy holds: commits may run here
	busy bool // a write on the split is in flight (here or the loop's)
	// wanted: the loop waits for the cell; commits take the loop's path
	// meanwhile, so a lane committing back to back cannot starve it.
	wanted bool
	held   bool // reserved by the loop (touched by the loop only)
	t      *tenancy
	v      *splitView
	rec    *progressRecord // the progress record as last written or seen
	rev    uint64          // its revision
}

// ----- on the loop ------------------------------------------------------------

// openCell makes a split just claimed committable on the caller's
// goroutine.
func (a *actor) openCell(id string, t *tenancy) {
	v := a.splits[id]
	c := &fenceCell{open: true, t: t, v: v, rec: v.prog, rev: v.progRev}
	a.cells[id] = c
	a.c.cells.Store(id, c)
}

// closeCell ends a tenancy's fast path; a commit already in flight
// finishes and reports to the loop as usual.
func (a *actor) closeCell(id string) {
	c := a.cells[id]
	if c == nil {
		return
	}
	c.mu.Lock()
	c.open = false
	c.mu.Unlock()
	delete(a.cells, id)
	a.c.cells.CompareAndDelete(id, c)
}

// reserve takes split id's cell for a write of the loop's. It fails while
// a commit is in flight; that commit's report runs the work queued
// meanwhile. A commit that landed before its report arrived is folded
// into the view first, so the loop's write fences on it.
func (a *actor) reserve(id string) bool {
	c := a.cells[id]
	if c == nil {
		return true
	}
	c.mu.Lock()
	if c.busy {
		c.wanted = true
		c.mu.Unlock()
		return false
	}
	c.busy, c.wanted, c.held = true, false, true
	rec, rev := c.rec, c.rev
	c.mu.Unlock()
	if v := a.splits[id]; v != nil && rev > v.progRev {
		a.upsert(id, rec, rev, live)
	}
	return true
}

// unreserve hands split id's cell back once the loop's write is done,
// at the state the view holds now.
func (a *actor) unreserve(id string) {
	c := a.cells[id]
	if c == nil || !c.held {
		return
	}
	v := a.splits[id]
	c.held = false
	c.mu.Lock()
	c.busy = false
	if v != nil && v.progRev >= c.rev {
		c.rec, c.rev = v.prog, v.progRev
	}
	c.mu.Unlock()
}

// cellSaw keeps a held split's cell at the newest record the view holds;
// back says the view adopted a lower revision (the store went back in time).
func (a *actor) cellSaw(id string, r *progressRecord, rev uint64, back bool) {
	c := a.cells[id]
	if c == nil {
		return
	}
	c.mu.Lock()
	if rev > c.rev || back {
		c.rec, c.rev = r, rev
	}
	c.mu.Unlock()
}

// committing reports whether a commit is in flight on split id's cell.
func (a *actor) committing(id string) bool {
	c := a.cells[id]
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy
}

// closeCells stops every commit on the caller's goroutine and waits for
// those in flight, whose reports the loop's last fold then takes in.
func (a *actor) closeCells() {
	a.c.fastOff.Store(true)
	a.c.fastMu.Lock()
	a.c.fastMu.Unlock() //nolint:staticcheck // a barrier: wait for the readers in flight
	for id := range a.cells {
		a.closeCell(id)
	}
}

// ----- on the committing goroutine ------------------------------------------------

// commitHere runs a commit on the caller's goroutine when the split's cell
// allows it; done false sends it through the loop instead.
func (c *StoreCoordinator) commitHere(ctx context.Context, split SplitID, epoch LeaseEpoch, p SplitProgress) (done bool, err error) {
	if p.Completed || ctx.Err() != nil {
		return false, nil
	}
	x, ok := c.cells.Load(split.id)
	if !ok {
		return false, nil
	}
	cell := x.(*fenceCell)
	c.fastMu.RLock()
	out, t, ok := c.tryCommit(cell, split.id, epoch, p)
	if !ok {
		c.fastMu.RUnlock()
		return false, nil
	}
	a, id := c.act, split.id
	pw := cell.v.pending.Load()
	if out.won {
		a.results.put(func() error {
			cell.v.pending.CompareAndSwap(pw, nil)
			a.committed(id, t, out.rec, out.rev)
			return a.next(id)
		})
		c.fastMu.RUnlock()
		return true, nil
	}
	// A lost compare-and-swap or a failed write: the loop judges it
	// (adopt, retry once, or fenced), exactly as for its own commits.
	cmd := &command{kind: cmdCommit, split: split, epoch: epoch, progress: p, reply: make(chan error, 1)}
	a.results.put(func() error {
		cell.v.pending.CompareAndSwap(pw, nil)
		return a.onSplit(id, func() error { return a.commitDone(cmd, t, out, 0, false, 0) })
	})
	c.fastMu.RUnlock()
	timer := time.NewTimer(3 * c.cfg.OpTimeout)
	defer timer.Stop()
	return true, c.await(ctx, cmd, timer)
}

// tryCommit reserves the cell and writes; ok false means the cell did not
// allow it and nothing was written. The caller holds fastMu shared.
func (c *StoreCoordinator) tryCommit(cell *fenceCell, id string, epoch LeaseEpoch, p SplitProgress) (out commitOut, t *tenancy, ok bool) {
	if c.fastOff.Load() || c.sticky() != nil {
		return out, nil, false
	}
	cell.mu.Lock()
	if !cell.open || cell.busy || cell.wanted || cell.rec == nil || epoch != 0 && uint64(epoch) != cell.t.epoch ||
		checkMonotone(id, cell.rec.Watermark, p.Watermark) != nil {
		cell.mu.Unlock()
		return out, nil, false
	}
	cell.busy = true
	t, prev, base := cell.t, cell.rec, cell.rev
	cell.mu.Unlock()

	a := c.act
	out = a.commitIO(a.ctx, cell.v, id, nextProgress(prev, t, p), base, false)

	cell.mu.Lock()
	cell.busy = false
	if out.won && out.rev > cell.rev {
		cell.rec, cell.rev = out.rec, out.rev
	}
	cell.mu.Unlock()
	return out, t, true
}
