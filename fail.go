package spate

import (
	"context"
	"fmt"
)

// A split reported poison: Fail consumes one delivery attempt and hands
// the split back, or quarantines it at the attempt limit.

// Fail implements [SplitCoordinator].
func (c *StoreCoordinator) Fail(ctx context.Context, split SplitID, reason string) error {
	return c.do(ctx, &command{kind: cmdFail, split: split, reason: reason})
}

// failSplit consumes one delivery attempt and hands the split back; at the
// cap it quarantines it instead (epoch bumped to fence any zombie).
func (a *actor) failSplit(cmd *command) error {
	id := cmd.split.id
	t, held := a.worker.owned[id]
	if !held {
		cmd.reply <- notHeld(id)
		return nil
	}
	a.m.failures.Inc()
	v := a.job.splits[id]
	rec := v.prog.clone()
	rec.Attempts++
	rec.Owner = nil
	rec.LastFailure = failureText(cmd.reason)
	quarantined := int(rec.Attempts) >= a.cfg.MaxAttempts
	if quarantined {
		rec.Status = statusQuarant
		rec.Epoch++
	}
	rec.WrittenAtMs = nowMs()
	baseRev := v.progRev
	a.splitIO(id, func(ctx context.Context) func() error {
		o, err := a.st.Update(ctx, Durable, prefixSplit+id, encode(rec), baseRev)
		return func() error {
			if err != nil {
				a.m.writes.WithLabelValues("error").Inc()
				cmd.reply <- fmt.Errorf("fail %s: %w", id, err)
				return nil
			}
			if !o.Won {
				a.m.writes.WithLabelValues("conflict").Inc()
				if t2, still := a.worker.owned[id]; still && t2 == t {
					a.dropLost(id, "fenced", "a failure report lost its compare-and-swap")
				}
				cmd.reply <- Fencedf("split %s: the failure report lost its compare-and-swap; nothing was written", id)
				return nil
			}
			a.m.writesOK.Inc()
			// Leave the owned set before folding, so the epoch bump is not
			// read as a foreign fence. No Lost: the source asked for this.
			leaseRev := a.leave(id)
			a.worker.revocations.settle(id, "forced")
			if quarantined {
				a.m.quarantines.Inc()
			}
			a.upsert(id, rec, o.Revision, live)
			a.dropLeaseAsync(id, leaseRev, t.epoch)
			a.log.Warn("split failed by the source", "split", id, "reason", cmd.reason, "attempts", rec.Attempts, "quarantined", quarantined)
			cmd.reply <- nil
			return nil
		}
	})
	return nil
}
