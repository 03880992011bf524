package fix

func (a *actor) committed(k string) { a.upsert(k) }
