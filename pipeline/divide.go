package pipeline

import (
	"errors"

	"github.com/spate-go/spate"
)

// SplitDivider is the optional capability of a [SplitSource] whose running
// splits can be divided (runtime division, docs/decisions/036): the split's
// owner gives up the part of its input it has not read to a new child
// split, which another lane, here or on another worker, then reads.
//
// The two calls bracket the coordinator's fenced write, and the source
// serializes them with its lane's reads so that no record is read by both
// halves:
//
//   - TrySplit stops the lane's reading at a position at or beyond what it
//     has read (position, or the first one beyond its read position if it
//     has read past position), and returns the division: that position and
//     the descriptors of both halves. It returns false when there is
//     nothing to give (the lane has read to its end, or the split cannot be
//     divided).
//   - SplitDone reports the outcome. kept true: the division is durable, or
//     its outcome is unknown and the tenancy ends; either way the lane
//     reads no further than the position. kept false: the coordinator
//     refused it and wrote nothing; the lane reads its whole split again.
//
// The positions are in the split's watermark encoding. Division.Primary
// becomes the split's descriptor for every later tenancy; the child
// starts from the beginning of Division.Residual with no progress.
type SplitDivider interface {
	TrySplit(split spate.SplitID, position int64) (spate.Division, bool)
	SplitDone(split spate.SplitID, d spate.Division, kept bool)
}

// DivisionProposer is the optional capability of a [SplitDivider] that
// picks where its own running split is best divided, for the leader's
// division trigger (docs/decisions/043): when the fleet idles, the leader
// asks the owner of the split with the longest expected remaining time
// ([spate.DivideRequested]), and the coordination driver divides it where the source
// proposes. A source that has it should also fill in
// [spate.SplitProgress] Remaining in EncodeCommit: that estimate, and its
// drop from commit to commit, is how the leader ranks the splits.
type DivisionProposer interface {
	// DivisionPoint proposes a division position of the split's unread
	// input, in its watermark encoding: about the middle of what the lane
	// has not read yet. False: the split is not worth dividing (too
	// little left, input that grows, a lane not reading).
	DivisionPoint(split spate.SplitID) (int64, bool)
}

// FractionProposer is the optional capability of a [DivisionProposer]
// that proposes a division at a given fraction of its unread input, so
// that one ask of the leader ([spate.DivideRequested] with Pieces k) can
// feed k idle workers at once: the coordination driver cuts the unread
// input into k+1 about equal parts, from the end, with k divisions
// (docs/decisions/043).
type FractionProposer interface {
	// DivisionPointAt proposes a division position num/den of the way
	// through what the lane has not read yet (0 < num < den), in the
	// split's watermark encoding. False: the part given up, or the part
	// kept, would be too small to be worth a split of its own (or, as
	// for DivisionPoint, the split is not divisible now).
	DivisionPointAt(split spate.SplitID, num, den int64) (int64, bool)
}

// divideAsked serves the leader's ask to divide split into pieces
// children: where the source proposes, if it can divide at all. With a
// [FractionProposer] and pieces k > 1 it divides k times, cutting from
// the end (each child gets about 1/(k+1) of what is unread, the split
// keeps the first part), so one ask feeds every idle worker; each is an
// ordinary division (one fenced write, below the earlier ones'
// positions). A source that cannot propose a fraction divides once, in
// the middle. A division that failed has ended the tenancy and said why
// (Divide); the pipeline goes on.
func (d *CoordinationDriver[C]) divideAsked(src SplitSource, split spate.SplitID, pieces int) {
	p, ok := src.(DivisionProposer)
	if !ok {
		return
	}
	if fp, ok := src.(FractionProposer); ok && pieces > 1 {
		for j := int64(pieces); j >= 1; j-- {
			// The split keeps j parts of j+1 of what it has left: the
			// child is one part (1/(pieces+1) of the first unread).
			pos, ok := fp.DivisionPointAt(split, j, j+1)
			if !ok {
				continue // too little for j+1 parts: try fewer
			}
			if _, ok, err := d.Divide(src, split, pos); err != nil || !ok {
				return // logged by Divide; the split reads on as it is
			}
		}
		return
	}
	pos, ok := p.DivisionPoint(split)
	if !ok {
		d.opts.log.Debug("asked to divide a split with nothing worth giving up", "split", split)
		return
	}
	_, _, _ = d.Divide(src, split, pos) // logged by Divide
}

// Divide divides the held split at position or beyond it: the source
// ([SplitDivider]) proposes the division and the coordinator
// ([spate.Divider]) records it with one fenced write. divided false with
// a nil error: nothing was divided (no such live tenancy, a source or a
// coordinator without the capability, nothing left to give, or a refusal),
// and the split reads on whole. An unknown outcome, or a fenced one, ends
// the tenancy: its lane is revoked, the split is handed back, and its next
// owner reads what landed; the error says why. Call it from the controller
// goroutine, like every other method.
func (d *CoordinationDriver[C]) Divide(src SplitSource, split spate.SplitID, position int64) (child spate.SplitID, divided bool, err error) {
	t := d.held[split]
	sd, okSrc := src.(SplitDivider)
	dv, okCoord := any(d.coord).(spate.Divider)
	if t == nil || !t.opened || t.state != tenancyLive || t.fenced || t.completed || t.releasing || !okSrc || !okCoord {
		return spate.SplitID{}, false, nil
	}
	div, ok := sd.TrySplit(split, position)
	if !ok {
		return spate.SplitID{}, false, nil
	}
	ctx, cancel := d.ctx()
	child, err = dv.Divide(ctx, split, t.epoch, div)
	cancel()
	switch {
	case err == nil:
		sd.SplitDone(split, div, true)
		t.spec.Descriptor, t.spec.Weight = div.Primary, max(div.PrimaryWeight, 1)
		d.opts.log.Info("split divided", "split", split, "child", child, "position", div.Position)
		return child, true, nil
	case errors.Is(err, spate.ErrDivisionRefused):
		sd.SplitDone(split, div, false)
		d.opts.log.Debug("division refused; the split reads on whole", "split", split, "error", err)
		return spate.SplitID{}, false, nil
	}
	// The division may have landed: reading on could read the residual
	// twice, reading only the primary could lose it. The tenancy ends.
	sd.SplitDone(split, div, true)
	d.retire(src, t, true)
	if !errors.Is(err, spate.ErrFenced) {
		ctx, cancel := d.ctx()
		if rerr := d.coord.Release(ctx, split); rerr != nil {
			d.opts.log.Warn("hand-back after a division in doubt failed; its lease expires", "split", split, "error", rerr)
		}
		cancel()
	}
	d.opts.log.Warn("a division's outcome is unknown or fenced: the split's tenancy ended; its next owner reads what landed", "split", split, "error", err)
	return spate.SplitID{}, false, err
}
