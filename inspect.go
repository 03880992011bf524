package spate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// JobState is a point-in-time picture of a job, read from its store without
// joining it: for operators (spate inspect), tests and tooling.
type JobState struct {
	Plan        PlanState
	Leader      *LeaderState
	Members     []MemberState
	Assignments map[string][]string // instance -> split ids
	Splits      []SplitState        // sorted by id
}

// PlanState is the plan record.
type PlanState struct {
	Fingerprint  string
	Generation   uint64
	Finality     PlanFinality
	Planned      uint64
	PlannerState []byte
}

// LeaderState is the current planner leader.
type LeaderState struct {
	Instance   string
	Generation uint64
}

// MemberState is one live worker.
type MemberState struct {
	Instance    string
	MaxInFlight int
}

// SplitStatus is a split's lifecycle state.
type SplitStatus string

// The split statuses; completed and quarantined are terminal.
const (
	StatusRunnable    SplitStatus = statusRunnable
	StatusCompleted   SplitStatus = statusCompleted
	StatusQuarantined SplitStatus = statusQuarant
	// StatusDamaged: the progress record cannot be read; the split is out
	// of play until it is fixed (see [SplitState.Damage]).
	StatusDamaged SplitStatus = "damaged"
)

// SplitState is one split's durable record, spec and live lease.
type SplitState struct {
	ID       SplitID
	Status   SplitStatus
	Owner    string // durable owner; "" after a graceful end or before the first claim
	Epoch    LeaseEpoch
	Attempts uint32
	// LastFailure is why the split's last attempt was charged: the reason
	// its source gave [SplitCoordinator.Fail], or the death of a tenancy
	// that made no progress. Empty when none was charged since it was
	// planned or requeued. A quarantined split's is why it was set aside.
	LastFailure string
	// Progress is the committed progress, nil before the first commit.
	Progress *SplitProgress
	// Weight is the split's weight: its spec's, or what its runtime
	// divisions kept of it; 0 when the spec is missing.
	Weight  uint64
	HasSpec bool
	// Descriptor is the split's descriptor as its spec records it (what
	// the source planned: a file source names its files), or, for a split
	// divided while it ran, what its divisions kept; nil when the spec is
	// missing. Shared: not to be modified.
	Descriptor []byte
	// LeaseOwner is the live lease's owner, "" when no lease is live.
	LeaseOwner string
	// Revision is the progress record's store revision.
	Revision uint64
	// WrittenAt is when the progress record was last written (a claim, a
	// commit, a release), by the writer's clock; zero when unknown.
	WrittenAt time.Time
	// Damage, when set, says which of the split's records cannot be read
	// and why (it matches [ErrUnreadableRecord]); DamageFix says what an
	// operator can do. A damaged split is out of play: no worker runs it
	// and it blocks completion.
	Damage    error
	DamageFix string
}

// LiveWorkers lists the instance ids of the workers present in the job
// store holds, sorted: those whose presence key is live. A worker that
// stopped without leaving stays listed until its presence key expires, one
// TTL after its last heartbeat. It needs no plan record, so it also sees
// the workers of a job that is still being planned.
func LiveWorkers(ctx context.Context, store Store) ([]string, error) {
	es, err := store.List(ctx, Ephemeral, prefixWorker)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(es))
	for _, e := range es {
		ids = append(ids, e.Key[len(prefixWorker):])
	}
	return ids, nil
}

// ErrNoJob is the error [InspectJob] matches when the store
// holds no job (no plan record): a job that was never started, or whose
// first worker has not yet written its plan.
var ErrNoJob = errors.New("no job here")

// InspectJob reads a job's state from store. fingerprint, when non-empty,
// must match the job's. Split records are parsed as strictly as the
// coordinator parses them; one that cannot be read (corrupt, or another
// job's) is shown on its split (Damage, DamageFix) rather than refusing
// the job. An unreadable plan record is a Fatal error naming its key.
func InspectJob(ctx context.Context, store Store, fingerprint string) (*JobState, error) {
	// Two listings, no separate read of the plan: the follower reads the
	// split records once the plan is in, whichever comes first.
	f := newJobFollower(fingerprint)
	f.Defer()
	for _, ks := range []Keyspace{Durable, Ephemeral} {
		es, err := store.List(ctx, ks, "")
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			if _, err := f.Apply(ks, WatchEvent{Kind: WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}); err != nil {
				return nil, err
			}
		}
	}
	if err := f.Decode(); err != nil {
		return nil, err
	}
	return f.State()
}

// noPlanError is InspectJob's error for a store without a plan record.
func noPlanError() error {
	return fmt.Errorf("%w: the store has no plan record: %w", ErrNoJob, ErrFatal)
}

func keySplit(id string) string { return prefixSplit + id }
func keySpec(id string) string  { return prefixSpec + id }

// Split returns one split of the state.
func (js *JobState) Split(id string) (SplitState, bool) {
	i, ok := slices.BinarySearchFunc(js.Splits, id, func(s SplitState, id string) int { return strings.Compare(s.ID.id, id) })
	if !ok {
		return SplitState{}, false
	}
	return js.Splits[i], true
}

// RequeueSplit puts a quarantined split back into play: status runnable,
// attempts reset, owner cleared and the epoch bumped, in one
// compare-and-swap on its progress record, so that any zombie of an earlier
// tenancy stays fenced. It fails if the split is not quarantined. It then
// clears the job's recorded verdict (a stall is over).
func RequeueSplit(ctx context.Context, store Store, fingerprint string, id SplitID) error {
	key := prefixSplit + id.id
	e, ok, err := store.Get(ctx, Durable, key)
	if err != nil {
		return err
	}
	if !ok {
		return Fatalf("requeue: split %s does not exist", id)
	}
	r, err := decodeProgress(key, id.id, e.Value, fingerprintHash(fingerprint))
	if err != nil {
		return err
	}
	if r.Status != statusQuarant {
		return Fatalf("requeue: split %s is %s, not quarantined", id, r.Status)
	}
	r.Status = statusRunnable
	r.Attempts = 0
	r.LastFailure = ""
	r.Owner = nil
	r.Epoch++
	r.WrittenAtMs = nowMs()
	o, err := store.Update(ctx, Durable, key, encode(r), e.Revision)
	if err != nil {
		return err
	}
	if !o.Won {
		return Retryablef("requeue: split %s changed while requeueing; try again", id)
	}
	// The job is no longer over: its recorded verdict goes, so that a
	// worker that watches only its own keys does not latch it again (a
	// running leader withdraws it too).
	if _, err := store.Delete(ctx, Durable, keyVerdict, AnyRevision); err != nil {
		return fmt.Errorf("requeue: split %s is runnable again, but the job's verdict record could not be cleared (its leader clears it when it runs): %w", id, err)
	}
	return nil
}

// String renders a split state for logs.
func (s SplitState) String() string {
	wm := "-"
	if s.Progress != nil {
		wm = fmt.Sprint(s.Progress.Watermark)
	}
	if s.Damage != nil {
		return fmt.Sprintf("%s %s: %v (fix: %s)", s.ID, StatusDamaged, s.Damage, s.DamageFix)
	}
	return fmt.Sprintf("%s %s owner=%q epoch=%d attempts=%d watermark=%s lease=%q", s.ID, s.Status, s.Owner, s.Epoch, s.Attempts, wm, s.LeaseOwner)
}
