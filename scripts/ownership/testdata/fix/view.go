package fix

type jobView struct {
	n    int
	seen map[string]bool
}

func (v *jobView) bump() { v.n++ }

// upsert folds a record: a pure decoder, its own state, a getter of the tenancy (not a
// reaction) and the tenancy's drop (a reaction).
func (a *actor) upsert(k string) {
	k = decode(k)
	a.job.seen[k] = true
	a.job.bump()
	if a.ten.holds(k) {
		a.drop(k)
	}
}
