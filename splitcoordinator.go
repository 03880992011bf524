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

	// Commit is the fenced durable commit of one owned split's progress. nil
	// means durable. ErrFenced means the split is no longer owned and
	// nothing was written: stop the split and do not retry. ErrRetryable
	// leaves the previous committed state authoritative; committing the
	// merged progress later is idempotent. A lower watermark than the
	// committed one is Fatal (a source bug).
	//
	// A commit on a split this instance does not hold (including one it
	// already committed completed) returns ErrFenced without a following
	// Lost event; a commit that loses its compare-and-swap returns ErrFenced
	// and a Lost follows.
	Commit(ctx context.Context, split SplitID, progress SplitProgress) error

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

	// Close stops the coordinator and releases what it still holds. It is
	// idempotent: a later call waits for the first and returns nil. Every
	// other method after Close returns ErrClosed.
	Close() error
}

// DrainReleaser is implemented by coordinators that tell a drained
// revocation's hand-back apart from a departure. See [ReleaseDrained].
type DrainReleaser interface {
	// ReleaseDrained hands back splits given up through a cooperative
	// revocation: each was drained and its tail committed. Semantically a
	// Release (attempt-free, best effort, idempotent), except that it
	// records the drain as completed and is never a departure, even for the
	// last held split.
	ReleaseDrained(ctx context.Context, splits ...SplitID) error
}

// RevokeDecliner is implemented by coordinators that emit [RevokeRequested].
// See [DeclineRevoke].
type RevokeDecliner interface {
	// DeclineRevoke reports that the clean path of a revocation is not
	// available (the source refused to stop the split's intake). The split
	// still leaves: the coordinator forces the release at once instead of
	// holding the rebalance open until its deadline, and the uncommitted
	// tail replays. Best effort and idempotent; declining a split that was
	// never revoked is a no-op.
	//
	// A coordinator that emits RevokeRequested must bound what it started
	// whatever the source does: force on a decline, and bound a drain that
	// never finishes with a deadline of its own.
	DeclineRevoke(ctx context.Context, split SplitID) error
}

// EpochCommitter is implemented by coordinators whose commits can be bound
// to one tenancy. See [CommitAt].
type EpochCommitter interface {
	// CommitAt is Commit for the tenancy gained at epoch only: if this
	// worker's tenancy of the split ended — even if it has since gained the
	// split again, at a higher epoch — it returns ErrFenced and writes
	// nothing.
	CommitAt(ctx context.Context, split SplitID, epoch LeaseEpoch, progress SplitProgress) error
}

// CommitAt commits progress for the tenancy gained at epoch, through
// c.CommitAt when c implements [EpochCommitter], else c.Commit.
//
// Prefer it to Commit: the coordinator works concurrently with its caller,
// so between the caller's last Poll and its Commit a tenancy can end and the
// split be gained again. A plain Commit then applies the old tenancy's
// progress to the new one (at best a duplicate, at worst a watermark
// regression that stops the coordinator); CommitAt fences it.
func CommitAt(ctx context.Context, c SplitCoordinator, split SplitID, epoch LeaseEpoch, p SplitProgress) error {
	if e, ok := c.(EpochCommitter); ok {
		return e.CommitAt(ctx, split, epoch, p)
	}
	return c.Commit(ctx, split, p)
}

// Departer is implemented by coordinators that can leave the fleet while
// still finishing what they hold. See [Depart].
type Departer interface {
	// Depart stops this worker taking part: it claims nothing more, stands
	// down as leader and withdraws its presence, so the leader reassigns
	// nothing to it; the splits it still holds stay held (renewed, and
	// committable) until they complete or are released. A graceful stop
	// departs first, then hands back what it will not finish — otherwise
	// the partial hand-back reads as an ordinary release and the worker
	// claims the splits straight back.
	Depart(ctx context.Context) error
}

// Depart calls c.Depart when c implements [Departer]; otherwise it does
// nothing (the coordinator departs when Release hands back its last split).
func Depart(ctx context.Context, c SplitCoordinator) error {
	if d, ok := c.(Departer); ok {
		return d.Depart(ctx)
	}
	return nil
}

// ReleaseDrained calls c.ReleaseDrained when c implements [DrainReleaser],
// and falls back to c.Release otherwise (the hand-back then reads as an
// ordinary one).
func ReleaseDrained(ctx context.Context, c SplitCoordinator, splits ...SplitID) error {
	if d, ok := c.(DrainReleaser); ok {
		return d.ReleaseDrained(ctx, splits...)
	}
	return c.Release(ctx, splits...)
}

// DeclineRevoke calls c.DeclineRevoke when c implements [RevokeDecliner];
// otherwise it does nothing and returns nil.
func DeclineRevoke(ctx context.Context, c SplitCoordinator, split SplitID) error {
	if d, ok := c.(RevokeDecliner); ok {
		return d.DeclineRevoke(ctx, split)
	}
	return nil
}
