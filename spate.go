// Package spate coordinates several instances of a data pipeline that divide
// one broker-less source's work (object-store backfills, database range
// scans, file tails) between them.
//
// Brokered sources bring their own group protocol; broker-less ones do not, so
// two processes pointed at the same input each see all of it. spate closes
// that gap with a leader-assigned model:
//
//   - a source-provided [SplitPlanner] enumerates the work as weighted
//     splits. It runs only on the fleet's elected leader; workers receive
//     split descriptors and never re-enumerate;
//   - the leader publishes a weight-balanced, sticky desired assignment per
//     instance;
//   - every worker holds a [SplitCoordinator] that leases the splits it was
//     named for, heartbeats them in the background and cooperatively drains
//     the ones it was not;
//   - progress commits are fenced compare-and-swap writes.
//
// The coordinator runs over any [Store] that keeps the store contract; the
// drivers live in stores/mem, stores/etcd, stores/redis and stores/nats, and
// the conformance package proves that a driver keeps the contract.
//
// # Delivery
//
// Coordination preserves at-least-once delivery, nothing stronger.
// Ownership revocations and takeovers may briefly overlap: a taken-over
// split's uncommitted tail is replayed by the new owner, and a zombie may
// emit records after its lease was seized. Both produce duplicates, never
// loss.
//
// # Fencing
//
// The correctness boundary is [SplitCoordinator.Commit]: one conditional
// write on the split's durable progress record at the revision the owner
// last observed. A commit from an instance that no longer owns the split
// loses that compare-and-swap, returns an error for which
// errors.Is(err, [ErrFenced]) holds, and writes nothing. Committed watermarks
// never decrease. Leases, watches and assignments only provide speed.
//
// # Leases
//
// Every owned split has a lease key in the store's ephemeral keyspace. The
// owner rewrites it every third of the lease; a worker that cannot reach the
// store for a whole lease stops its splits on its own (self-fencing) rather
// than run unfenced. A dead owner's leases expire and its splits are
// reassigned; they resume from the last committed progress.
//
// # Quarantine
//
// A split that repeatedly kills its owners, or is explicitly failed, is
// quarantined after a bounded number of attempts instead of crashing
// workers forever. Quarantined splits stay visible and block [AllComplete],
// so a bounded job whose planned data went unprocessed ends [Stalled].
package spate

import (
	"fmt"
	"strings"
)

// SplitIDMaxLen is the maximum length of a [SplitID] in bytes.
const SplitIDMaxLen = 128

// SplitID is the deterministic identity of one split, minted by the planner.
//
// It must be stable across replans of unchanged work, so that replanning is
// idempotent (create-if-absent in the store) and progress resumes across
// owners. A SplitID holds 1–128 bytes of [A-Za-z0-9_-]; '.' is reserved as
// the store's key separator. The zero SplitID is invalid; build one with
// [NewSplitID].
type SplitID struct{ id string }

// NewSplitID validates and wraps a split id. A violation is a Fatal error.
func NewSplitID(id string) (SplitID, error) {
	if err := validateIdent("split id", id); err != nil {
		return SplitID{}, err
	}
	return SplitID{id: id}, nil
}

// MustSplitID is like [NewSplitID] but panics on an invalid id. It is meant
// for constants and tests.
func MustSplitID(id string) SplitID {
	s, err := NewSplitID(id)
	if err != nil {
		panic(err)
	}
	return s
}

// String returns the id.
func (s SplitID) String() string { return s.id }

// IsZero reports whether s is the zero (invalid) SplitID.
func (s SplitID) IsZero() bool { return s.id == "" }

// Compare orders split ids bytewise; it returns -1, 0 or +1.
func (s SplitID) Compare(o SplitID) int { return strings.Compare(s.id, o.id) }

// MarshalText implements encoding.TextMarshaler.
func (s SplitID) MarshalText() ([]byte, error) { return []byte(s.id), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it validates the id.
func (s *SplitID) UnmarshalText(b []byte) error {
	id, err := NewSplitID(string(b))
	if err != nil {
		return err
	}
	*s = id
	return nil
}

// ValidateInstanceID reports whether id is usable as an instance id: the
// same rule as a split id (1–128 bytes of [A-Za-z0-9_-]). Pod names with
// dots must be rewritten.
func ValidateInstanceID(id string) error { return validateIdent("instance id", id) }

func validateIdent(what, id string) error {
	if len(id) == 0 || len(id) > SplitIDMaxLen {
		return Fatalf("%s must be 1..%d bytes, got %d (%q)", what, SplitIDMaxLen, len(id), id)
	}
	for i := 0; i < len(id); i++ {
		if !identByte(id[i]) {
			// Report the rune, not the byte, so non-ASCII input reads well.
			r := []rune(id[i:])[0]
			return Fatalf("%s may only contain [A-Za-z0-9_-], got %q in %q", what, r, id)
		}
	}
	return nil
}

func identByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// LeaseEpoch is the fencing token of one tenancy of one split, minted by the
// coordinator on every ownership change. It strictly increases across the
// owners of a split; a write presented under a superseded epoch is rejected.
//
// It is distinct from the plan generation (which orders leaders) and from
// the pipeline's assignment epoch (a per-process counter).
type LeaseEpoch uint64

// SplitSpec is one unit of leasable work, as the planner enumerated it.
//
// The descriptor travels verbatim to whichever worker gains the split, so
// workers never re-enumerate the input. It is opaque to spate and to the
// stores; keep it small, because stores cap value sizes. Descriptors are
// written once at planning and never rewritten by commits, so their size
// never taxes the commit path.
type SplitSpec struct {
	// ID is the split's deterministic identity.
	ID SplitID
	// Descriptor is the source-defined payload: everything a worker needs to
	// process the split (object keys with versions and sizes, an id range).
	Descriptor []byte
	// Weight is the split's relative cost (bytes, rows) and the balance
	// objective: the leader distributes summed weight, not split counts. A
	// planner that leaves every weight at 1 gets count balancing, which is
	// right when splits are uniform. 0 is treated as 1.
	Weight uint64
}

// NewSplitSpec returns a split with the default weight of 1.
func NewSplitSpec(id SplitID, descriptor []byte) SplitSpec {
	return SplitSpec{ID: id, Descriptor: descriptor, Weight: 1}
}

// WithWeight returns a copy of s with the given cost hint.
func (s SplitSpec) WithWeight(w uint64) SplitSpec {
	s.Weight = w
	return s
}

// effectiveWeight is the weight the assignment balances on: max(Weight, 1).
func (s SplitSpec) effectiveWeight() uint64 { return max(s.Weight, 1) }

// PlannedSplit is a split as the planner submits it: the spec plus optional
// seed progress. Seeds are first-writer-wins: a seed never overwrites an
// existing progress record. That is the migration path for work that already
// has a pre-coordination checkpoint; a brand-new source plans without seeds.
type PlannedSplit struct {
	Spec SplitSpec
	// Seed is durable progress to store if, and only if, the split has none.
	Seed *SplitProgress
}

// NewPlannedSplit returns a planned split without seed progress.
func NewPlannedSplit(spec SplitSpec) PlannedSplit { return PlannedSplit{Spec: spec} }

// WithSeed returns a copy of p carrying seed progress (first writer wins).
func (p PlannedSplit) WithSeed(seed SplitProgress) PlannedSplit {
	p.Seed = &seed
	return p
}

// PlanFinality says whether a plan's enumeration can still grow.
type PlanFinality uint8

const (
	// PlanOpen means more work may appear: the leader re-runs the planner
	// every replan interval and AllComplete never fires.
	PlanOpen PlanFinality = iota
	// PlanFinal means the enumeration is complete. Once every split is
	// completed the job reports AllComplete (or Stalled when some were
	// quarantined). Final is sticky: a later plan that reports Open does
	// not reopen a final plan.
	PlanFinal
)

func (f PlanFinality) String() string {
	switch f {
	case PlanOpen:
		return "open"
	case PlanFinal:
		return "final"
	}
	return fmt.Sprintf("PlanFinality(%d)", uint8(f))
}

// SplitPlan is one planner run's output.
type SplitPlan struct {
	// Splits is the enumerated work. Splits already planned are deduplicated
	// by id (create-if-absent), so emitting them again is a no-op.
	Splits []PlannedSplit
	// Finality says whether this enumeration is complete.
	Finality PlanFinality
	// PlannerState is an opaque cursor persisted in the plan record and
	// handed back on the next run through [PlanContext.PlannerState] (an
	// object-store listing's start-after key, say). nil keeps the previous
	// cursor; a non-nil empty slice stores an empty cursor.
	PlannerState []byte
}

// NewSplitPlan returns a plan that keeps the previous planner cursor.
func NewSplitPlan(splits []PlannedSplit, finality PlanFinality) SplitPlan {
	return SplitPlan{Splits: splits, Finality: finality}
}

// WithPlannerState returns a copy of p that persists state as the cursor.
func (p SplitPlan) WithPlannerState(state []byte) SplitPlan {
	if state == nil {
		state = []byte{}
	}
	p.PlannerState = state
	return p
}

// PlanContext is what the coordinator hands the planner on each run.
type PlanContext struct {
	// PlannerState is the cursor the previous run persisted; nil on the
	// first plan ever.
	PlannerState []byte
	// Generation is the current plan generation. It is bumped by every new
	// leader, so a planner can tell a fresh leadership from a continuation.
	Generation uint64
}

// SplitProgress is one split's durable progress, written by the fenced
// [SplitCoordinator.Commit] and handed to the next owner in [Gained].
type SplitProgress struct {
	// Watermark is one past the last acknowledged record, in the source's
	// own offset encoding. Committed watermarks never decrease.
	Watermark int64
	// State is source-defined resume state, opaque to spate and the stores.
	State []byte
	// Completed marks the split fully delivered and committed. It is
	// terminal: a completed split is never offered again.
	Completed bool
	// Output is the sink's committable: what of the split's output the
	// watermark covers (for a staging sink, the staged bytes to publish).
	// It is opaque to spate and the stores, and written by the same fenced
	// compare-and-swap as the watermark, so output a commit lists becomes
	// visible only if that commit won. Nil for at-least-once sinks.
	Output []byte
	// Parked marks a split whose reading waits on its input (a followed
	// file that has been idle for a while): its owner keeps it, and finds
	// out itself when there is more, but it takes none of the owner's
	// lanes ([Config] MaxInFlight), so a split waiting for a lane is
	// assigned and claimed beside it. The next commit that does not set
	// it takes the lane back; a claim or a release clears it.
	Parked bool
	// Remaining is the source's estimate of the split's input left to
	// read after Watermark, in the units of its spec's weight (0: none or
	// not known). It is a hint: the leader measures each running split's
	// rate from its commits' Remaining and asks the owner of the one with
	// the longest expected remaining time to divide it when workers idle
	// (docs/decisions/043). A source that cannot divide its splits leaves
	// it 0.
	Remaining uint64
}

// NewSplitProgress returns in-progress state.
func NewSplitProgress(watermark int64, state []byte) SplitProgress {
	return SplitProgress{Watermark: watermark, State: state}
}

// CompletedProgress returns terminal state: fully delivered and committed.
func CompletedProgress(watermark int64, state []byte) SplitProgress {
	return SplitProgress{Watermark: watermark, State: state, Completed: true}
}
