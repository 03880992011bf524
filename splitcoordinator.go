package spate

import "context"

// SplitCoordinator is a worker's coordination handle: it leases splits
// toward a bounded working set, surfaces ownership changes, and owns the
// fenced progress commit. [StoreCoordinator] implements it over any [Store].
//
// It is driven from one controller goroutine. Implementations do their I/O
// elsewhere, bound every blocking call, and keep leases alive without being
// polled.
type SplitCoordinator interface {
	// SetWaker hands the coordinator the waker it signals whenever a later
	// Poll would return something. Call it once, before Start.
	SetWaker(w Waker)

	// Start joins the job with this worker's planner (used only while this
	// instance is leader) and starts claiming and renewing. It is called
	// exactly once; it returns once the work is started, and failures of
	// the startup itself surface from the next Poll.
	Start(planner SplitPlanner) error

	// Poll returns the ownership and job-state changes since the last call.
	// It never blocks; park on the [Waker] instead. A coordinator failure is
	// returned once any events queued before it were delivered, and is
	// sticky: every later call fails with it.
	Poll() ([]Event, error)

	// CommitAt is the fenced durable commit of one owned split's
	// progress, for the tenancy gained at epoch (the Gained event's) only.
	// nil means durable. ErrFenced means the tenancy is over and nothing
	// was written: stop the split and do not retry. That includes a
	// tenancy that ended even though the split has since been gained
	// again, at a higher epoch: the coordinator works concurrently with
	// its caller, so between the caller's last Poll and its commit a
	// tenancy can end and the split be gained again, and the old
	// tenancy's progress must not land on the new one. ErrRetryable
	// leaves the previous committed state authoritative; committing the
	// merged progress later is idempotent. A lower watermark than the
	// committed one is Fatal (a source bug).
	//
	// A commit on a split this instance does not hold (including one it
	// already committed completed) returns ErrFenced without a following
	// Lost event; a commit that loses its compare-and-swap returns ErrFenced
	// and a Lost follows.
	CommitAt(ctx context.Context, split SplitID, epoch LeaseEpoch, progress SplitProgress) error

	// Fail reports an owned split unprocessable by this tenancy: it consumes
	// one delivery attempt and hands the split back for another worker to
	// retry; at the attempt cap the split is quarantined instead. Use it for
	// poison input; a transient local problem calls for Release, which
	// consumes nothing.
	Fail(ctx context.Context, split SplitID, reason string) error

	// Release voluntarily hands back owned splits (shutdown, scale-down) so
	// that peers claim them without waiting out a lease. It consumes no
	// attempts, is best effort and idempotent; splits not released expire.
	// Releasing the last held split is a departure: the worker stops
	// claiming.
	Release(ctx context.Context, splits ...SplitID) error

	// ReleaseDrained hands back splits given up through a cooperative
	// revocation: each was drained and its tail committed. Semantically a
	// Release (attempt-free, best effort, idempotent), except that it
	// records the drain as completed and is never a departure, even for the
	// last held split.
	ReleaseDrained(ctx context.Context, splits ...SplitID) error

	// DeclineRevoke reports that the clean path of a revocation is not
	// available (the source cannot stop the split's intake at a boundary).
	// The split still leaves: the coordinator forces the release at once
	// instead of holding the rebalance open until its deadline, and the
	// uncommitted tail replays. Best effort and idempotent; declining a
	// split that was never revoked is a no-op. A coordinator that emits
	// [RevokeRequested] must bound what it started whatever the source
	// does: force on a decline, and bound a drain that never finishes with
	// a deadline of its own.
	DeclineRevoke(ctx context.Context, split SplitID) error

	// Depart stops this worker taking part: it claims nothing more, stands
	// down as leader and withdraws its presence, so the leader reassigns
	// nothing to it; the splits it still holds stay held (renewed, and
	// committable) until they complete or are released. A graceful stop
	// departs first, then hands back what it will not finish: otherwise
	// the partial hand-back reads as an ordinary release and the worker
	// claims the splits straight back.
	Depart(ctx context.Context) error

	// Close stops the coordinator and releases what it still holds. It is
	// idempotent: a later call waits for the first and returns nil. Every
	// other method after Close returns ErrClosed.
	Close() error
}
