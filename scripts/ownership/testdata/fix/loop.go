package fix

// actor is the fixture's actor: one view, one tenancy, a dirty flag.
type actor struct {
	c     *StoreCoordinator
	job   jobView
	ten   tenancy
	dirty bool
}

func (a *actor) step() int { return a.job.n + len(a.job.seen) }
