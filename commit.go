package spate

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// The commit path, whole: Commit and CommitAt, the fast path on the
// committing goroutine (fence cells, commitHere), and the loop's path
// (startCommit, commitIO beside the loop, commitDone and the verdict on a
// compare-and-swap that lost).
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

// Commit is [StoreCoordinator.CommitAt] for whichever tenancy of split
// this worker holds when the commit arrives. It is not part of
// [SplitCoordinator]: a source must use CommitAt, since a tenancy can end
// and the split be gained again between its last Poll and its commit, and
// a plain Commit would then land the old tenancy's progress on the new
// one. It serves a caller that holds each split once and never races a
// re-gain (a tool, a test).
func (c *StoreCoordinator) Commit(ctx context.Context, split SplitID, p SplitProgress) error {
	if done, err := c.commitHere(ctx, split, 0, p); done {
		return err
	}
	return c.do(ctx, &command{kind: cmdCommit, split: split, progress: p})
}

// CommitAt implements [SplitCoordinator].
func (c *StoreCoordinator) CommitAt(ctx context.Context, split SplitID, epoch LeaseEpoch, p SplitProgress) error {
	if done, err := c.commitHere(ctx, split, epoch, p); done {
		return err
	}
	return c.do(ctx, &command{kind: cmdCommit, split: split, epoch: epoch, progress: p})
}

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

// fenceCells is the loop's table of the held splits' commit fences.
type fenceCells struct {
	cells  map[string]*fenceCell
	shared *sync.Map // the coordinator's copy of cells, read by committing goroutines
}

// openCell makes a split just claimed committable on the caller's
// goroutine.
func (l *fenceCells) openCell(id string, t *tenancy, v *splitView) {
	c := &fenceCell{open: true, t: t, v: v, rec: v.prog, rev: v.progRev}
	l.cells[id] = c
	l.shared.Store(id, c)
}

// closeCell ends a tenancy's fast path; a commit already in flight
// finishes and reports to the loop as usual.
func (l *fenceCells) closeCell(id string) {
	c := l.cells[id]
	if c == nil {
		return
	}
	c.mu.Lock()
	c.open = false
	c.mu.Unlock()
	delete(l.cells, id)
	l.shared.CompareAndDelete(id, c)
}

// reserve takes split id's cell for a write of the loop's. It fails while
// a commit is in flight; that commit's report runs the work queued
// meanwhile. A commit that landed before its report arrived is folded
// into the view first, so the loop's write fences on it.
func (a *actor) reserve(id string) bool {
	c := a.io.cells[id]
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
	if v := a.job.splits[id]; v != nil && rev > v.progRev {
		a.upsert(id, rec, rev, live)
	}
	return true
}

// unreserve hands split id's cell back once the loop's write is done,
// at the state the view holds now (v: the split's view, nil if gone).
func (l *fenceCells) unreserve(id string, v *splitView) {
	c := l.cells[id]
	if c == nil || !c.held {
		return
	}
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
func (l *fenceCells) cellSaw(id string, r *progressRecord, rev uint64, back bool) {
	c := l.cells[id]
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
func (l *fenceCells) committing(id string) bool {
	c := l.cells[id]
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
	for id := range a.io.cells {
		a.io.closeCell(id)
	}
}

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
		a.io.results.put(func() error {
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
	a.io.results.put(func() error {
		cell.v.pending.CompareAndSwap(pw, nil)
		return a.onSplit(id, func() error { return a.commitDone(cmd, t, out, 0, false, 0) })
	})
	c.fastMu.RUnlock()
	timer := time.NewTimer(c.tm.command)
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

// commitOut is what a commit learned beside the loop.
type commitOut struct {
	won  bool
	rec  *progressRecord // the record written
	rev  uint64
	read bool            // the record was re-read (after a lost CAS, or for a regression check)
	cur  *progressRecord // what the re-read found; nil if the record is gone
	err  error
}

// startCommit is the fenced commit: one compare-and-swap on the progress
// record at the revision this worker last observed. No explicit epoch
// comparison is needed: any ownership change moved the revision. With
// confirmed unset and a watermark below the view's, it first re-reads the
// record: a store that went back in time may have shown a watermark that
// never became durable.
func (a *actor) startCommit(cmd *command, confirmed bool, try int) error {
	id, p := cmd.split.id, cmd.progress
	t, ok := a.tenancyOf(cmd)
	if !ok {
		return nil
	}
	v := a.job.splits[id]
	check := !confirmed && checkMonotone(id, v.prog.Watermark, p.Watermark) != nil
	rec := nextProgress(v.prog, t, p)
	baseRev := v.progRev
	since := a.job.mark()
	a.splitIO(id, func(ctx context.Context) func() error {
		out := a.commitIO(ctx, v, id, rec, baseRev, check)
		return func() error {
			v.pending.Store(nil)
			return a.commitDone(cmd, t, out, since, check, try)
		}
	})
	return nil
}

// tenancyOf is the tenancy in which a split command at cmd.epoch acts;
// ok is false (and the command answered) when this worker does not hold
// the split, or holds it at another epoch.
func (a *actor) tenancyOf(cmd *command) (t *tenancy, ok bool) {
	id := cmd.split.id
	t, held := a.worker.owned[id]
	if !held {
		cmd.reply <- notHeld(id)
		return nil, false
	}
	if cmd.epoch != 0 && uint64(cmd.epoch) != t.epoch {
		cmd.reply <- Fencedf("split %s: the tenancy at epoch %d ended (this worker now holds epoch %d); nothing was written", id, cmd.epoch, t.epoch)
		return nil, false
	}
	return t, true
}

// nextProgress is the record a commit of p writes over prev.
func nextProgress(prev *progressRecord, t *tenancy, p SplitProgress) *progressRecord {
	rec := prev.clone()
	if advances(prev.Watermark, p.Watermark) {
		rec.AdvancedEpoch = t.epoch
	}
	wm := p.Watermark
	rec.Watermark, rec.State, rec.Completed, rec.Output = &wm, p.State, p.Completed, p.Output
	rec.Parked = p.Parked && !p.Completed
	rec.Remaining = p.Remaining
	if p.Completed {
		rec.Remaining = 0
		rec.Status = statusCompleted
	}
	return rec
}

func (e *env) commitIO(ctx context.Context, v *splitView, id string, rec *progressRecord, baseRev uint64, check bool) (out commitOut) {
	key := prefixSplit + id
	reread := func() {
		out.read = true
		got, ok, err := e.st.Get(ctx, Durable, key)
		switch {
		case err != nil:
			out.err = err
		case ok:
			out.rev = got.Revision
			out.cur, out.err = decodeProgress(key, id, got.Value, e.fpHash)
		}
	}
	if check {
		reread()
		return out
	}
	rec.WrittenAtMs = nowMs()
	value := encode(rec)
	v.pending.Store(&pendingWrite{value: value, rec: rec})
	start := time.Now()
	o, err := e.st.Update(ctx, Durable, key, value, baseRev)
	e.m.writeDur.Observe(time.Since(start).Seconds())
	if err != nil {
		e.m.writes.WithLabelValues("error").Inc()
		out.err = err
		return out
	}
	if o.Won {
		e.m.writesOK.Inc()
		out.won, out.rec, out.rev = true, rec, o.Revision
		return out
	}
	e.m.writes.WithLabelValues("conflict").Inc()
	reread()
	return out
}

// commitVerdict is what a commit's compare-and-swap loss means.
type commitVerdict uint8

const (
	// verdictFenced: another owner took the split (or its record is gone).
	verdictFenced commitVerdict = iota + 1
	// verdictLanded: exactly this commit, or an earlier completing one of
	// this tenancy, landed before (its reply was lost): adopt it.
	verdictLanded
	// verdictRetry: an earlier commit of this tenancy landed though its
	// reply was lost, so the revision moved under us but nobody else did:
	// commit again on top of it.
	verdictRetry
	// verdictRegress: the commit would move the committed watermark back:
	// a source bug, Fatal.
	verdictRegress
)

// lostCommitVerdict judges a lost commit compare-and-swap from the record
// the store holds now (nil if it is gone): the tenancy is this worker's at
// epoch, and p is the progress it tried to commit.
func lostCommitVerdict(cur *progressRecord, self string, epoch uint64, p SplitProgress) commitVerdict {
	switch {
	case cur == nil:
		return verdictFenced
	case cur.owner() != self || cur.Epoch != epoch || cur.Status != statusRunnable && !cur.Completed:
		return verdictFenced
	case cur.Watermark != nil && *cur.Watermark == p.Watermark && cur.Completed == p.Completed && bytes.Equal(cur.State, p.State) && bytes.Equal(cur.Output, p.Output):
		return verdictLanded
	case cur.Completed:
		return verdictLanded
	case cur.Watermark != nil && p.Watermark < *cur.Watermark:
		return verdictRegress
	}
	return verdictRetry
}

func (a *actor) commitDone(cmd *command, t *tenancy, out commitOut, since uint64, checked bool, try int) error {
	id, p := cmd.split.id, cmd.progress
	reply := func(err error) error {
		cmd.reply <- err
		return nil
	}
	fatal := func(err error) error {
		// Sticky before the reply: the caller's next commit may take the
		// fast path (commit.go), which does not pass through the loop that
		// is about to stop.
		a.c.fail(err)
		cmd.reply <- err
		return err
	}
	if out.err != nil {
		if isDamage(out.err) {
			a.damage(id, prefixSplit+id, 0, out.err)
			return reply(Fencedf("split %s: its progress record became unreadable (%v); nothing was written", id, out.err))
		}
		if kindOf(out.err) == kindFatal {
			return fatal(out.err)
		}
		if checked {
			return reply(fmt.Errorf("commit %s: checking a watermark regression: %w", id, out.err))
		}
		if out.read {
			return reply(fmt.Errorf("commit %s: compare-and-swap lost and the re-read failed: %w", id, out.err))
		}
		return reply(fmt.Errorf("commit %s: %w", id, out.err))
	}
	if out.cur != nil {
		a.upsert(id, out.cur, out.rev, readSince(since))
	}
	if checked {
		if _, still := a.worker.owned[id]; !still {
			return reply(notHeld(id))
		}
		if err := checkMonotone(id, a.job.splits[id].prog.Watermark, p.Watermark); err != nil {
			return fatal(err)
		}
		return a.startCommit(cmd, true, try)
	}
	if out.won {
		a.committed(id, t, out.rec, out.rev)
		return reply(nil)
	}
	cur := out.cur
	switch lostCommitVerdict(cur, a.self, t.epoch, p) {
	case verdictLanded:
		a.committed(id, t, cur, out.rev)
		return reply(nil)
	case verdictRegress:
		return fatal(checkMonotone(id, cur.Watermark, p.Watermark))
	case verdictRetry:
		if try == 0 {
			return a.startCommit(cmd, true, 1)
		}
	}
	if t2, still := a.worker.owned[id]; still && t2 == t {
		a.dropLost(id, "fenced", "a commit lost its compare-and-swap")
	}
	return reply(Fencedf("split %s: the commit lost its compare-and-swap (another owner took it); nothing was written", id))
}
