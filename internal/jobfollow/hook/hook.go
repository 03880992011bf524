// Package hook is where package spate leaves its job follower for
// internal/jobfollow: spate imports this package (which imports nothing of
// the project's) and sets [New] in its init; internal/jobfollow, which
// imports spate to name the follower's method set, reads it. Use
// internal/jobfollow, not this package.
package hook

// Touched says what one record changed.
type Touched struct {
	// Split is the id of the split whose state the record is part of, ""
	// for a record of the job as a whole.
	Split string
	// Job is set when the plan, the leader, the members or the
	// assignments changed (a new plan re-reads every split: Job, not
	// each Split, is set then).
	Job bool
	// Member is the instance whose presence record was written or
	// deleted: a live member rewrites it every heartbeat, so a watcher
	// sees each member's beats here.
	Member string
}

// New returns package spate's follower of a job with no records yet, a
// value with jobfollow.Follower's methods. Package spate sets it.
var New func(fingerprint string) any
