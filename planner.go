package spate

import "context"

// SplitPlanner is the source-provided work enumerator. It runs only on the
// fleet's elected leader: at job start, once per new leader, and again every
// replan interval while the plan is [PlanOpen].
//
// Every worker presents an equivalent planner to [SplitCoordinator.Start];
// whichever instance holds leadership uses its own copy. Plan may block on
// I/O (an object-store LIST, an index query); the coordinator calls it off
// its own goroutine and cancels ctx when leadership is lost or the
// coordinator closes.
type SplitPlanner interface {
	// Fingerprint is the job's identity, derived from configuration and never
	// from the enumeration. Every worker joining a job must present a
	// byte-equal fingerprint or be rejected Fatal, so that divergent
	// configurations cannot read the same split table two ways. It must not
	// be empty.
	Fingerprint() string

	// Plan enumerates the current work. Unchanged work must yield the same
	// split ids, so that re-emitting already planned splits is a no-op.
	// Return a Retryable error to have the run retried on the next replan
	// tick; any other error is Fatal.
	Plan(ctx context.Context, pc PlanContext) (SplitPlan, error)
}
