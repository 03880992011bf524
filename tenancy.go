package spate

// The end of a tenancy, on the loop: leave when the worker ends it itself
// (its own write decides the record), dropLost when it is taken from it.

// leave takes a split out of the owned set and stops renewing its lease;
// it returns the lease's last revision.
func (a *actor) leave(id string) uint64 {
	delete(a.owned, id)
	a.w.scopeDirty = true
	a.closeCell(id)
	return a.renew.release(id)
}

// dropLost ends a tenancy involuntarily: it leaves the durable record and
// the lease alone, settles any revocation as forced and emits Lost.
func (a *actor) dropLost(id, reason, why string) {
	t, held := a.owned[id]
	if !held {
		return
	}
	if t.releasing {
		a.log.Debug("split release in flight; its answer decides whether it was lost", "split", id, "reason", reason, "why", why)
		return
	}
	a.leave(id)
	if reason == "starved" {
		// Decision: a self-fence is always forgiven (this process's next
		// claim of the split is attempt-free). Renewals run on their own
		// goroutine, beside the loop and the source, so no split can starve
		// them: a self-fence is evidence about the store, never the split.
		a.selfFenced[id] = t.epoch
	}
	a.settle(id, "forced")
	a.m.losses.WithLabelValues(reason).Inc()
	a.log.Warn("split lost", "split", id, "reason", reason, "why", why)
	a.c.emit(Lost{Split: SplitID{id: id}})
}
