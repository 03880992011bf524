package spate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"time"
)

// Runtime division of a running split (docs/decisions/036).
//
// A split's owner, and only its owner, may divide the split it is
// reading: its source stops the split's reading at a position at or
// beyond where it has read (serialized with its own reads, so no record
// is read by both halves) and names the two halves. Divide then writes
// ONE compare-and-swap on the split's progress record at the revision
// this tenancy last saw, like a commit: the record keeps the primary as
// the split's own descriptor and names the residual as a child. A
// zombie's division loses that compare-and-swap and writes nothing.
//
// The leader then creates each child a record names as a split of its
// own, spec first then progress, both create-if-absent under an id
// derived from the parent's id and the position ([ChildSplitID]): a
// retry, or two leaders, create it once; a store that writes one key at
// a time (NATS KV) needs nothing more, because the parent's record names
// the child, and whichever leader finds a named child missing creates
// it. The plan is never re-run (decision 009): a split gains children.
// A job is complete only when every child its records name is listed
// and completed too (judgeTerminal).

// Division is one runtime division of a running split, as its owner's
// source proposes it: the split keeps Primary (its input up to Position)
// and gives up Residual (its input from Position on) to a new child
// split.
type Division struct {
	// Position is where the residual begins, in the source's own offset
	// encoding (the one its watermarks use). It is at or beyond the
	// split's committed watermark and below the position of every earlier
	// division of the split.
	Position int64
	// Primary is the split's descriptor from now on: what it keeps.
	Primary []byte
	// PrimaryWeight is the primary's cost hint (0 counts as 1).
	PrimaryWeight uint64
	// Residual is the child split's descriptor: what the split gives up.
	Residual []byte
	// ResidualWeight is the child's cost hint (0 counts as 1).
	ResidualWeight uint64
}

// Divider is the optional capability of a [SplitCoordinator] that can
// divide a running split; [StoreCoordinator] has it.
type Divider interface {
	// Divide records the division of split, held at epoch, and returns
	// the child's id. nil: the division is durable; the owner keeps
	// reading the primary only, and the leader creates the child. An
	// error matching [ErrDivisionRefused] wrote nothing and the tenancy
	// goes on: the source reads its whole split again. Any other error
	// leaves the outcome unknown: the source must stop reading the split
	// and hand it back (a Lost follows if the coordinator ended the
	// tenancy itself); its next owner reads what landed.
	Divide(ctx context.Context, split SplitID, epoch LeaseEpoch, d Division) (SplitID, error)
}

var _ Divider = (*StoreCoordinator)(nil)

// ErrDivisionRefused is matched (with ErrRetryable) by a division the
// coordinator refused before writing anything: the split is not
// divisible there (a position below its committed watermark or at or
// beyond an earlier division's, a completed split, too many divisions).
var ErrDivisionRefused = errors.New("spate: division refused")

// maxChildren bounds the divisions of one split: its record, rewritten by
// every commit, carries each child's descriptor. A child can be divided
// in its turn.
const maxChildren = 16

// ChildSplitID is the id of the child that dividing parent at position
// creates: the parent's id, "_d" and the position in decimal (a position
// below zero gives "_dm" and its magnitude), or, when that is longer than
// [SplitIDMaxLen], a prefix of it and a hash of the whole. Planners
// should not mint ids of that form.
func ChildSplitID(parent SplitID, position int64) SplitID {
	pos := strconv.FormatInt(position, 10)
	if position < 0 {
		pos = "m" + pos[1:]
	}
	id := parent.id + "_d" + pos
	if len(id) <= SplitIDMaxLen {
		return SplitID{id: id}
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	sum := fmt.Sprintf("_h%016x", h.Sum64())
	return SplitID{id: id[:SplitIDMaxLen-len(sum)] + sum}
}

// Divide implements [Divider].
func (c *StoreCoordinator) Divide(ctx context.Context, split SplitID, epoch LeaseEpoch, d Division) (SplitID, error) {
	if split.IsZero() {
		return SplitID{}, Retryablef("divide: the zero split id: %w", ErrDivisionRefused)
	}
	if d.Primary == nil || d.Residual == nil {
		return SplitID{}, Retryablef("divide %s: the primary and the residual both need a descriptor (an empty one is []byte{}): %w", split, ErrDivisionRefused)
	}
	child := ChildSplitID(split, d.Position)
	return child, c.do(ctx, &command{kind: cmdDivide, split: split, epoch: epoch, division: &d})
}

// checkDivision refuses a division the split's record rules out.
func checkDivision(id string, r *progressRecord, child string, d *Division) error {
	refuse := func(format string, args ...any) error {
		return Retryablef("divide %s at %d: %s; nothing was written: %w", id, d.Position, fmt.Sprintf(format, args...), ErrDivisionRefused)
	}
	switch {
	case r.Completed || r.Status != statusRunnable:
		return refuse("the split is %s", r.Status)
	case r.Watermark != nil && d.Position < *r.Watermark:
		return refuse("the position is below the committed watermark %d", *r.Watermark)
	case len(r.Children) >= maxChildren:
		return refuse("the split was divided %d times already (divide its children instead)", len(r.Children))
	}
	for _, c := range r.Children {
		if d.Position >= c.Position || c.ID == child {
			return refuse("an earlier division gave up everything from %d (child %s)", c.Position, c.ID)
		}
	}
	return nil
}

// dividedRecord is the record a division writes over r.
func dividedRecord(r *progressRecord, child string, d *Division) *progressRecord {
	rec := r.clone()
	rec.Descriptor, rec.Weight = d.Primary, max(d.PrimaryWeight, 1)
	// What the last commit said was left, less what the child takes: the
	// division trigger times the split from it, and a record that still
	// counted the residual would have it measure the residual's bytes as
	// read (an inflated rate, so the split was not asked again).
	if r.Remaining > 0 {
		rec.Remaining = max(r.Remaining-min(r.Remaining, max(d.ResidualWeight, 1)), 1)
	}
	rec.Children = append(rec.Children, childSplit{ID: child, Position: d.Position,
		Weight: max(d.ResidualWeight, 1), Descriptor: d.Residual})
	return rec
}

// hasDivision reports whether r holds the division d of the tenancy at
// epoch held by self.
func hasDivision(r *progressRecord, self string, epoch uint64, child string, d *Division) bool {
	if r == nil || r.owner() != self || r.Epoch != epoch || r.Status != statusRunnable || !bytes.Equal(r.Descriptor, d.Primary) {
		return false
	}
	return slices.ContainsFunc(r.Children, func(c childSplit) bool { return c.ID == child })
}

// divideSplit is the division's one fenced write, on the loop's path
// (onSplit): no commit runs beside it on the split.
func (a *actor) divideSplit(cmd *command) error {
	id, d := cmd.split.id, cmd.division
	t, ok := a.tenancyOf(cmd)
	if !ok {
		return nil
	}
	v := a.job.splits[id]
	child := ChildSplitID(cmd.split, d.Position).id
	if err := checkDivision(id, v.prog, child, d); err != nil {
		cmd.reply <- err
		return nil
	}
	rec := dividedRecord(v.prog, child, d)
	baseRev := v.progRev
	since := a.job.mark()
	a.splitIO(id, func(ctx context.Context) func() error {
		out := a.commitIO(ctx, v, id, rec, baseRev, false)
		return func() error {
			v.pending.Store(nil)
			return a.divideDone(cmd, t, child, out, since)
		}
	})
	return nil
}

func (a *actor) divideDone(cmd *command, t *tenancy, child string, out commitOut, since uint64) error {
	id, d := cmd.split.id, cmd.division
	ended := func(why string) {
		if t2, still := a.worker.owned[id]; still && t2 == t {
			a.dropLost(id, "fenced", why)
		}
	}
	if out.err != nil {
		if isDamage(out.err) {
			a.damage(id, prefixSplit+id, 0, out.err)
		} else if kindOf(out.err) == kindFatal {
			a.c.fail(out.err)
			cmd.reply <- out.err
			return out.err
		}
		// The write may have landed: reading on would read the residual
		// twice, and restoring the whole split would lose it if it did.
		// The tenancy ends; its next owner reads what the record says.
		ended("a division's outcome is unknown")
		cmd.reply <- Fencedf("split %s: the division's outcome is unknown (%v); the tenancy ended so that nothing is read twice or lost", id, out.err)
		return nil
	}
	if out.cur != nil {
		a.upsert(id, out.cur, out.rev, readSince(since))
	}
	switch {
	case out.won:
		a.upsert(id, out.rec, out.rev, live)
	case hasDivision(out.cur, a.self, t.epoch, child, d):
		// Our write landed though its compare-and-swap reported lost (a
		// retried request): adopt it.
	default:
		ended("a division lost its compare-and-swap")
		cmd.reply <- Fencedf("split %s: the division lost its compare-and-swap (another owner took it); nothing was written", id)
		return nil
	}
	a.m.divisions.Inc()
	a.log.Info("split divided: the leader creates the residual as a child split", "split", id, "child", child,
		"position", d.Position, "epoch", t.epoch)
	cmd.reply <- nil
	return nil
}

// ----- the leader creates the children ------------------------------------------

// division is the divided splits whose children the leader has not
// seen created yet (parents): noted from their records (noteChildren),
// served by createChildren.
type division struct {
	parents map[string]bool
}

// noteChildren remembers a divided split whose children the leader must
// see created (createChildren).
func (d *division) noteChildren(id string, r *progressRecord) {
	if len(r.Children) > 0 {
		if d.parents == nil {
			d.parents = map[string]bool{}
		}
		d.parents[id] = true
	}
}

// createChildren, on the leader, creates every child a divided split's
// record names and the view does not hold yet: spec first, then progress,
// each create-if-absent (a create that loses found it created: the
// watch brings it).
func (a *actor) createChildren(now time.Time) {
	if len(a.division.parents) == 0 {
		return
	}
	for _, pid := range slices.Sorted(maps.Keys(a.division.parents)) {
		p := a.job.splits[pid]
		if p == nil || p.prog == nil {
			continue // a deleted record: restoreMissing brings it back
		}
		born := true
		for _, c := range p.prog.Children {
			v := a.job.splits[c.ID]
			if v != nil && v.prog != nil && v.spec != nil {
				continue
			}
			born = false
			if _, gone := a.records.missing[c.ID]; gone || a.io.busy[c.ID] || !a.io.due(opKey{"child", c.ID}, now) {
				continue
			}
			a.createChild(pid, c)
		}
		if born {
			delete(a.division.parents, pid)
		}
	}
}

func (a *actor) createChild(parent string, c childSplit) {
	id := c.ID
	spec := &specRecord{Schema: SchemaVersion, ID: id, FP: a.fpHash, Generation: a.leader.term.generation,
		Weight: c.Weight, Descriptor: nonNil(c.Descriptor)}
	prog := newProgressRecord(id, a.fpHash, nil)
	a.splitIO(id, func(ctx context.Context) func() error {
		specOut, err := a.st.Create(ctx, Durable, prefixSpec+id, encode(spec))
		var progOut Outcome
		if err == nil {
			progOut, err = a.st.Create(ctx, Durable, prefixSplit+id, encode(prog))
		}
		return func() error {
			if err != nil {
				a.log.Warn("creating a divided split's child failed; retrying", "split", parent, "child", id, "err", err)
				a.failed(opKey{"child", id})
				return nil
			}
			v := a.job.view(id)
			if specOut.Won && v.spec == nil {
				v.spec = spec
			}
			if progOut.Won {
				a.upsert(id, prog, progOut.Revision, live)
				a.log.Info("created a divided split's child", "split", parent, "child", id)
			}
			if v.spec == nil || v.prog == nil {
				a.failed(opKey{"child", id}) // created by another: the watch brings it
			}
			a.dirty = true
			return nil
		}
	})
}

// own is the split as its progress record says it is now: the spec's
// descriptor and weight, or what the last division kept of them.
func (v *splitView) own() (descriptor []byte, weight uint64) {
	descriptor, weight = v.spec.Descriptor, v.spec.Weight
	if v.prog != nil && v.prog.Descriptor != nil {
		descriptor, weight = v.prog.Descriptor, max(v.prog.Weight, 1)
	}
	return descriptor, weight
}
