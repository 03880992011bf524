package fix

type tenancy struct {
	owned map[string]bool
}

func (t *tenancy) holds(k string) bool { return t.owned[k] }

// drop writes the tenancy's state, climbs back to the view and tells the
// handle.
func (a *actor) drop(k string) {
	delete(a.ten.owned, k)
	a.job.bump()
	a.c.emit(k)
}
