// Package jobfollow hands the root package's job follower to the job view
// (internal/jobview) without putting it in the root's API: the follower is
// the project's own machinery, not something a user of package spate calls.
//
// Package spate sets [New] in its init, so any package that imports spate
// (as internal/jobview does) finds it set. The value New returns has the
// method set
//
//	Apply(spate.Keyspace, spate.WatchEvent) (jobfollow.Touched, error)
//	Defer()
//	Decode() error
//	Split(id string) (spate.SplitState, bool)
//	Meta() (*spate.JobState, error)
//	State() (*spate.JobState, error)
//
// which the user declares as an interface of its own (this package cannot
// name spate's types: spate imports it).
package jobfollow

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

// New returns a follower of a job with no records yet. fingerprint, when
// non-empty, must match the job's plan (as for spate.InspectJob). Package
// spate sets it.
var New func(fingerprint string) any
