package spate

import (
	"cmp"
	"slices"
)

// claimKind says how a claimable split came to be free, which decides
// whether taking it consumes a delivery attempt.
type claimKind uint8

const (
	// claimCreate: never owned (no lease, no owner, epoch 0). Free.
	claimCreate claimKind = iota + 1
	// claimReleased: handed back gracefully (no lease, owner cleared). Free.
	claimReleased
	// claimReclaim: a live lease under our own instance id from a restarted
	// predecessor. Consumes an attempt.
	claimReclaim
	// claimExpired: the owner died (no lease, owner still set). Consumes an
	// attempt.
	claimExpired
)

func (k claimKind) String() string {
	return [...]string{"?", "create", "released", "reclaim", "expired"}[k]
}

func (k claimKind) consumesAttempt() bool { return k == claimReclaim || k == claimExpired }

// acquisitionReason is the metric label of a claim that won.
func (k claimKind) acquisitionReason() string {
	return [...]string{"?", "create", "reassigned", "reclaimed", "expired"}[k]
}

// claimCandidate is one split this worker could take, or must quarantine.
type claimCandidate struct {
	id         string
	kind       claimKind
	quarantine bool // the takeover would reach the attempt cap
}

// claimInput is one split of the view, as the claim scan sees it.
type claimInput struct {
	id         string
	status     string
	owner      string // durable owner, "" if none
	epoch      uint64
	attempts   uint32
	leaseOwner string // live lease owner, "" if no lease
	leaseOurs  bool   // the live lease is this process's own leftover
	selfFenced bool   // this process stopped the tenancy itself (store unreachable)
	hasSpec    bool
	held       bool // this worker holds it
}

// claimCandidates is the pure claim scan. A split is a candidate when it is
// runnable, not held here, and has no live lease owned by another instance.
// A lease left by this very process (a hand-back whose delete has not
// landed yet) counts as no lease: the record's owner decides the kind.
// A takeover that consumes an attempt and would reach maxAttempts becomes a
// quarantine (allowed without the spec: it writes only the progress record);
// a claim needs the spec (there is nothing to hand the source without it).
// Candidates are ordered by kind (the contended kinds last), then id; weight
// plays no part (placement comes from the leader).
func claimCandidates(splits []claimInput, self string, maxAttempts int) []claimCandidate {
	var out []claimCandidate
	for _, s := range splits {
		if s.status != statusRunnable || s.held {
			continue
		}
		var kind claimKind
		switch {
		case s.leaseOwner != "" && s.leaseOwner != self:
			continue
		case s.leaseOwner == self && !s.leaseOurs:
			kind = claimReclaim // a restarted predecessor's lease
		case s.owner == self && s.selfFenced:
			// This very process stopped the tenancy because it could not
			// reach the store: no evidence against the split.
			kind = claimReleased
		case s.owner != "":
			kind = claimExpired
		case s.epoch == 0:
			kind = claimCreate
		default:
			kind = claimReleased
		}
		if kind.consumesAttempt() && int(s.attempts)+1 >= maxAttempts {
			out = append(out, claimCandidate{id: s.id, kind: kind, quarantine: true})
			continue
		}
		if !s.hasSpec {
			continue
		}
		out = append(out, claimCandidate{id: s.id, kind: kind})
	}
	slices.SortFunc(out, func(a, b claimCandidate) int {
		if c := cmp.Compare(a.kind, b.kind); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out
}
