package jobview

import (
	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobfollow"
)

// follower is the root package's job follower, reached through
// internal/jobfollow (it is not in package spate's API): it keeps a job's
// state current from its records one at a time, as a watch of the job's
// two keyspaces delivers them, so a live view pays for what changed, not
// for the job's size. It is not safe for concurrent use.
type follower interface {
	// Apply folds one watch event of keyspace ks and says what it
	// touched; an error only for a record that is not the damage of one
	// split (the plan's).
	Apply(ks spate.Keyspace, ev spate.WatchEvent) (jobfollow.Touched, error)
	// Defer keeps split records unread until Decode, which reads them on
	// every core (for a large snapshot).
	Defer()
	Decode() error
	// Split is one split's state, as spate.InspectJob would list it.
	Split(id string) (spate.SplitState, bool)
	// Meta is the job's state without its splits.
	Meta() (*spate.JobState, error)
	// State is the whole job, splits sorted by id.
	State() (*spate.JobState, error)
}

// newFollower returns a follower of a job with no records yet;
// fingerprint, when non-empty, must match the job's plan.
func newFollower(fingerprint string) follower {
	return jobfollow.New(fingerprint).(follower)
}
