// Package jobfollow hands the root package's job follower to the job view
// (internal/jobview) without putting it in the root's API: the follower is
// the project's own machinery, not something a user of package spate calls.
//
// Package spate leaves its constructor in internal/jobfollow/hook (this
// package imports spate to name the follower's methods, so spate cannot
// import it); [New] returns it as a [Follower].
package jobfollow

import (
	"fmt"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobfollow/hook"
)

// Touched says what one record changed.
type Touched = hook.Touched

// Follower is the root package's job follower: it keeps a job's state
// current from its records one at a time, as a watch of the job's two
// keyspaces delivers them, so a live view pays for what changed, not for
// the job's size. It is not safe for concurrent use.
type Follower interface {
	// Apply folds one watch event of keyspace ks and says what it
	// touched; an error only for a record that is not the damage of one
	// split (the plan's).
	Apply(ks spate.Keyspace, ev spate.WatchEvent) (Touched, error)
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

// New returns a follower of a job with no records yet. fingerprint, when
// non-empty, must match the job's plan (as for spate.InspectJob).
func New(fingerprint string) Follower {
	v := hook.New(fingerprint)
	f, ok := v.(Follower)
	if !ok {
		panic(fmt.Sprintf("jobfollow: package spate's follower (%T) lacks a method of jobfollow.Follower", v))
	}
	return f
}
