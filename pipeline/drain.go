package pipeline

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
)

// A revocation drains by default. When the coordinator asks for a split back
// (spate.RevokeRequested) and the source agrees (BeginRevoke, true by
// default), the coordination driver stops polling the split's lane at the
// next batch boundary, waits until everything the lane emitted is
// acknowledged, commits that watermark and hands the split back. Nothing of
// the split is read twice: the next owner resumes exactly where this one
// stopped.
//
// The lane is stopped by the coordination driver, not the source, so any
// source gets a clean hand-back; a source declines only when it cannot stop
// between two batches (the coordinator then forces the hand-back and the
// uncommitted tail is read again by the next owner).

// gatedLane is a tenancy's lane as the runtime sees it: the coordination
// driver can stop it, after which it is never polled again, and it knows the
// watermark of the last batch it emitted.
type gatedLane struct {
	Lane
	stopped atomic.Bool
	// mu is held across the inner Poll: once the coordination driver holds
	// it after stop, no batch is in flight and emitted is final.
	mu      sync.Mutex
	emitted int64 // one past the last emitted record (the resume watermark before any)
}

func newGatedLane(l Lane, from int64) *gatedLane { return &gatedLane{Lane: l, emitted: from} }

// Poll polls the lane until it is stopped; a stopped lane is idle (it
// blocks up to timeout, never spins) until the runtime drops it.
func (g *gatedLane) Poll(maxRecords int, timeout time.Duration) (*Batch, error) {
	if !g.stopped.Load() {
		g.mu.Lock()
		if !g.stopped.Load() {
			b, err := g.Lane.Poll(maxRecords, timeout)
			if b != nil && b.Ack != nil {
				g.emitted = max(g.emitted, b.Ack.LastOffset()+1)
			}
			g.mu.Unlock()
			return b, err
		}
		g.mu.Unlock()
	}
	if timeout > 0 {
		time.Sleep(timeout)
	}
	return nil, nil
}

// stop ends the lane's polling; a poll under way finishes.
func (g *gatedLane) stop() { g.stopped.Store(true) }

// final returns the watermark of all the lane emitted once it is stopped
// and no poll is under way; ok is false while a poll may still emit.
func (g *gatedLane) final() (emitted int64, ok bool) {
	if !g.stopped.Load() || !g.mu.TryLock() {
		return 0, false
	}
	defer g.mu.Unlock()
	return g.emitted, true
}

// lastOfDrain reports whether a commit of a draining tenancy at watermark
// is its last: its lane is stopped with no poll under way, and watermark
// covers all the lane emitted. Only that commit is final for a staging
// sink. One below it (the chase commits what is acknowledged so far) is
// not: a sink seals its stage at a final commit and refuses every later
// one, so the drain's own commit of the rest would never land, and the
// split would be held until its revocation was forced at the deadline.
func (t *tenancy) lastOfDrain(watermark int64) bool {
	emitted, ok := t.gate.final()
	return ok && watermark >= emitted
}

// beginDrain starts the drain of a live tenancy the coordinator revoked,
// unless the source declines it.
func (d *CoordinationDriver[C]) beginDrain(src SplitSource, t *tenancy) bool {
	if t.state != tenancyLive || !t.opened || t.fenced || t.completed || t.gate == nil {
		return false
	}
	if !src.BeginRevoke(t.spec.ID) {
		return false
	}
	t.gate.stop()
	t.state = tenancyDraining
	// The drain ends at a commit of all the lane emitted: chase it rather
	// than wait for the commit tick.
	d.chase = append(d.chase, t.partition)
	return true
}

// advanceDrains ends the drains whose lanes are stopped and whose every
// emitted record is acknowledged: a final commit of that watermark (if the
// last won commit is short of it), then a drained hand-back. A split
// whose final commit completes it is completed instead.
func (d *CoordinationDriver[C]) advanceDrains(src SplitSource) error {
	var firstErr error
	for _, t := range d.sortedHeld() {
		if t.state != tenancyDraining || t.fenced {
			continue
		}
		emitted, ok := t.gate.final()
		if !ok || t.acked < emitted {
			continue // a poll may still emit, or acknowledgments are due
		}
		if t.unpublished != nil {
			if err := d.publish(t, t.unpublished); err != nil {
				firstErr = pickError(firstErr, err)
				continue
			}
		}
		if t.completing != nil {
			if err := d.finishCompletion(src, t); err != nil {
				firstErr = pickError(firstErr, err)
			}
			continue // completed (retired), or retried on the next poll
		}
		if t.won < emitted {
			p, err := src.EncodeCommit(t.spec.ID, emitted)
			if err != nil {
				firstErr = pickError(firstErr, fmt.Errorf("encode the final commit of split %s: %w", t.spec.ID, err))
				continue
			}
			if err := d.commitTenancy(src, t, p); err != nil {
				firstErr = pickError(firstErr, err)
				continue
			}
			if t.state == tenancyRetired || t.completing != nil || t.unpublished != nil || t.won < emitted {
				continue // completed, fenced, or not landed yet: asked again on the next poll
			}
		}
		t.handedOff = true
		ctx, cancel := d.ctx()
		err := d.coord.ReleaseDrained(ctx, t.spec.ID)
		cancel()
		if err != nil && !errors.Is(err, spate.ErrFenced) {
			d.opts.log.Warn("drained hand-back failed; the lease expires and a peer takes over, resuming where this drain committed", "split", t.spec.ID, "error", err)
		}
		d.retire(src, t, false)
	}
	return firstErr
}
