package spate

import "fmt"

// Event is an ownership or job-state change returned by
// [SplitCoordinator.Poll]. The concrete types are [Gained], [Lost],
// [RevokeRequested], [DivideRequested], [Quarantined], [PlanFinalized],
// [AllComplete] and [Stalled]; use a type switch.
//
// Events for one split are ordered: a split is Gained before it can be Lost,
// and a re-Gained split always carries a higher [LeaseEpoch] than the
// tenancy it replaces.
type Event interface {
	fmt.Stringer
	isEvent()
}

// Gained means this instance now holds the lease for the split and must
// start (or resume) processing it.
type Gained struct {
	// Split is the split now owned, descriptor included: the gaining worker
	// never saw the planner run.
	Split SplitSpec
	// Epoch is the fencing token of this tenancy.
	Epoch LeaseEpoch
	// Progress is the last committed progress to resume from, nil for a
	// split that never committed.
	Progress *SplitProgress
}

// Lost means the lease ended involuntarily: seized by a peer after expiry,
// stolen for balance, forced out by a revocation deadline, or self-fenced
// after renewals could not reach the store. The source must stop the split
// promptly and must not commit it again (a late commit is fenced anyway;
// this event is the cooperative fast path).
type Lost struct {
	Split SplitID
}

// RevokeRequested means the leader stopped assigning the split to this
// instance and wants it back. The owner should stop intake at a safe
// boundary, make a final fenced commit covering everything it emitted and
// hand the split back with a drained release, so the next owner replays
// nothing.
//
// The split is leaving either way: a revocation is a decision, not a
// proposal. A source that declines, or does not finish within the drain
// deadline, has the release forced and its uncommitted tail replays under
// the next owner. The one exception is not the source's to take: the
// coordinator cancels a revocation its leader took back, and then nothing is
// forced. The event is idempotent; for a split this instance does not hold
// it is a no-op.
type RevokeRequested struct {
	Split SplitID
}

// DivideRequested means the leader asks this instance to divide a split
// it holds (docs/decisions/043): workers idle, nothing waits for a lane,
// and this split has the longest expected remaining time. A source that
// can divide it gives up the unread remainder of its input to a child
// split (the driver's Divide, decision 036); one that cannot ignores it.
// It is a hint, never repeated for the same tenancy and children.
//
// Pieces is how many workers the leader saw idle when it asked: the
// owner should divide what it has not read into Pieces+1 about equal
// parts, keep the first and give up the others as Pieces children (Pieces
// divisions, each one fenced write, cut from the end). 0 counts as 1.
type DivideRequested struct {
	Split  SplitID
	Pieces int
}

func (e DivideRequested) String() string { return fmt.Sprintf("DivideRequested(%s)", e.Split) }

// Quarantined means the split exhausted its delivery attempts and was
// parked. It is never offered again, stays visible, and blocks [AllComplete].
type Quarantined struct {
	Split    SplitID
	Attempts uint32
}

// PlanFinalized means the job's plan is final: no split will be added to
// it. Each coordinator delivers it once, when it first reads the final
// plan record (a bounded job's at once; an open job's when its planner
// turns it Final), and always before AllComplete or Stalled. A source that
// follows growing input (a file tail) reads to the end of what it has and
// completes its splits from then on.
type PlanFinalized struct {
	Planned uint64 // the splits in the final plan
}

// AllComplete means the plan is final and every split committed completed.
// An instance that owns nothing must keep polling until a terminal event
// arrives: it stands by to cover an owner that dies at the finish line.
type AllComplete struct{}

// Stalled means the plan is final and nothing is runnable or running, but
// some splits are quarantined, so the job cannot finish cleanly. It is
// delivered exactly where AllComplete would have been.
type Stalled struct {
	Completed   uint64
	Quarantined uint64
	// Damaged names the splits out of play because one of their records
	// cannot be read (see [ErrUnreadableRecord]); the coordinator's log
	// names each key, its cause and the fix.
	Damaged []string
}

func (Gained) isEvent()          {}
func (Lost) isEvent()            {}
func (RevokeRequested) isEvent() {}
func (Quarantined) isEvent()     {}
func (DivideRequested) isEvent() {}
func (PlanFinalized) isEvent()   {}
func (AllComplete) isEvent()     {}
func (Stalled) isEvent()         {}

func (e Gained) String() string {
	if e.Progress == nil {
		return fmt.Sprintf("Gained(%s epoch=%d)", e.Split.ID, e.Epoch)
	}
	return fmt.Sprintf("Gained(%s epoch=%d watermark=%d completed=%t)",
		e.Split.ID, e.Epoch, e.Progress.Watermark, e.Progress.Completed)
}
func (e Lost) String() string            { return fmt.Sprintf("Lost(%s)", e.Split) }
func (e RevokeRequested) String() string { return fmt.Sprintf("RevokeRequested(%s)", e.Split) }
func (e Quarantined) String() string {
	return fmt.Sprintf("Quarantined(%s attempts=%d)", e.Split, e.Attempts)
}
func (e PlanFinalized) String() string { return fmt.Sprintf("PlanFinalized(planned=%d)", e.Planned) }
func (AllComplete) String() string     { return "AllComplete" }
func (e Stalled) String() string {
	if len(e.Damaged) > 0 {
		return fmt.Sprintf("Stalled(completed=%d quarantined=%d damaged=%v)", e.Completed, e.Quarantined, e.Damaged)
	}
	return fmt.Sprintf("Stalled(completed=%d quarantined=%d)", e.Completed, e.Quarantined)
}
