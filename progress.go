package spate

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// progressRecord is the durable "split.{id}" key: the fence. Every ownership
// change bumps Epoch; every commit is a compare-and-swap on its revision.
type progressRecord struct {
	Schema   int     `json:"schema"`
	ID       string  `json:"id"`
	FP       uint64  `json:"fp"`
	Epoch    uint64  `json:"epoch"`
	Status   string  `json:"status"`
	Owner    *string `json:"owner"`
	Attempts uint32  `json:"attempts"`
	// AdvancedEpoch is the epoch of the last tenancy whose commit moved
	// the watermark forward (absent in records of earlier versions: 0).
	// A tenancy that ends without a graceful release is charged an
	// attempt only if it did not advance: its death is then evidence
	// against the split, not against the store.
	AdvancedEpoch uint64 `json:"advanced_epoch,omitempty"`
	Watermark     *int64 `json:"watermark"`
	State         []byte `json:"state"`
	Completed     bool   `json:"completed"`
	// Output is the sink's committable (SplitProgress.Output), absent for
	// at-least-once sinks and in records of earlier versions.
	Output      []byte `json:"output,omitempty"`
	WrittenAtMs int64  `json:"written_at_ms"`
	// LastFailure is why the last attempt was charged (a source's Fail
	// reason, or a tenancy that ended without a release or progress), at
	// most maxFailureLen bytes; absent when no attempt was charged.
	LastFailure string `json:"last_failure,omitempty"`
	// Parked is SplitProgress.Parked of the last commit: the split takes
	// none of its owner's lanes. Absent when false.
	Parked bool `json:"parked,omitempty"`
	// Descriptor and Weight are the split's own after a runtime division
	// (divide.go): what it kept of its spec's. Absent until the first
	// division: the spec record's hold.
	Descriptor []byte `json:"descriptor,omitempty"`
	Weight     uint64 `json:"weight,omitempty"`
	// Children are the residuals its owners divided off, oldest first: the
	// leader creates each as a split of its own (create-if-absent), and
	// recreates it from here if it is missing.
	Children []childSplit `json:"children,omitempty"`
	// Remaining is the last commit's SplitProgress.Remaining: the input
	// its owner had left to read (the leader's division trigger measures
	// rates from it). Absent: not known.
	Remaining uint64 `json:"remaining,omitempty"`
}

// childSplit is one residual of a runtime division, as its parent's
// record names it.
type childSplit struct {
	ID         string `json:"id"`
	Position   int64  `json:"position"`
	Weight     uint64 `json:"weight"`
	Descriptor []byte `json:"descriptor"`
}

// maxFailureLen bounds a recorded failure reason: records stay small.
const maxFailureLen = 512

// failureText is reason as a record keeps it: valid UTF-8, at most
// maxFailureLen bytes, cut at a rune boundary.
func failureText(reason string) string {
	reason = strings.ToValidUTF8(reason, "?")
	if len(reason) <= maxFailureLen {
		return reason
	}
	cut := maxFailureLen - len("…")
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut] + "…"
}

// deathText is the failure of a tenancy that ended without a release and
// without advancing the watermark.
func deathText(owner string, epoch uint64) string {
	if owner == "" {
		owner = "its owner"
	}
	return fmt.Sprintf("the tenancy of %s at epoch %d ended without a release and without progress (the worker died, hung past its lease, or the split crashes it)", owner, epoch)
}

func decodeProgress(key, id string, data []byte, fp uint64) (*progressRecord, error) {
	var r progressRecord
	if err := decodeRecord(data, &r, &r.Schema); err != nil {
		return nil, recordError(Durable, key, err)
	}
	if err := checkIdentity(key, id, r.ID, fp, r.FP); err != nil {
		return nil, err
	}
	switch r.Status {
	case statusRunnable, statusCompleted, statusQuarant:
	default:
		return nil, recordError(Durable, key, fmt.Errorf("status %q", r.Status))
	}
	if r.Owner != nil && ValidateInstanceID(*r.Owner) != nil {
		return nil, recordError(Durable, key, fmt.Errorf("owner %q is not an instance id", *r.Owner))
	}
	for _, c := range r.Children {
		if _, err := NewSplitID(c.ID); err != nil || c.Descriptor == nil {
			return nil, recordError(Durable, key, fmt.Errorf("child split %q: an invalid id or no descriptor", c.ID))
		}
	}
	return &r, nil
}

// progressOf is the progress a record hands the source: nil before the
// first commit.
func (r *progressRecord) progress() *SplitProgress {
	if r.Watermark == nil {
		return nil
	}
	st := r.State
	if st == nil {
		st = []byte{}
	}
	return &SplitProgress{Watermark: *r.Watermark, State: st, Completed: r.Completed, Output: r.Output, Parked: r.Parked}
}

func (r *progressRecord) owner() string {
	if r.Owner == nil {
		return ""
	}
	return *r.Owner
}

func (r *progressRecord) clone() *progressRecord {
	c := *r
	if r.Owner != nil {
		o := *r.Owner
		c.Owner = &o
	}
	if r.Watermark != nil {
		w := *r.Watermark
		c.Watermark = &w
	}
	c.Children = slices.Clip(r.Children) // an append copies: the parent's stays
	return &c
}

func strPtr(s string) *string { return &s }

// newProgressRecord is a freshly planned progress record, seeded from seed
// when given (first writer wins).
func newProgressRecord(id string, fp uint64, seed *SplitProgress) *progressRecord {
	r := &progressRecord{Schema: SchemaVersion, ID: id, FP: fp, Status: statusRunnable, WrittenAtMs: nowMs()}
	if seed != nil {
		w := seed.Watermark
		r.Watermark = &w
		r.State = seed.State
		r.Output = seed.Output
		r.Completed = seed.Completed
		if seed.Completed {
			r.Status = statusCompleted
		}
	}
	return r
}

// checkMonotone is the monotone-watermark rule: a commit may never move a
// split's committed watermark back. cur is the committed watermark (nil
// before the first commit).
func checkMonotone(id string, cur *int64, next int64) error {
	if cur != nil && next < *cur {
		return Fatalf("commit of split %s would move its committed watermark back from %d to %d: a source bug (or a store whose compare-and-swap let a stale write through); stopping",
			id, *cur, next)
	}
	return nil
}

// advanced reports whether the current tenancy (at r.Epoch) moved the
// watermark forward: its non-graceful end is then no evidence against the
// split.
func (r *progressRecord) advanced() bool { return r.Epoch > 0 && r.AdvancedEpoch == r.Epoch }

// advances reports whether committing watermark next over the committed
// cur moves the split forward.
func advances(cur *int64, next int64) bool { return cur == nil || next > *cur }
