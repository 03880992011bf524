package fix

// decode and check are pure helpers: they select no leaf of the actor's
// state, so the commit's path through the state handlers leaves them out.
func decode(k string) string { return check(k) }

func check(k string) string { return k }
