package fix

func (a *actor) note(k string) {
	a.job.seen[k] = true
	a.dirty = true
	_ = actor{job: jobView{n: 1}} // construction: neither a read nor a write
}

func long(a, b, c, d, e, f, g, h int) {}
