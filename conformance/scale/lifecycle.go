package scale

import (
	"testing"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/internal/hook"
)

// LifecycleGoals are the store calls one step of a split's lifecycle may
// cost, per mode: "releaser" is a store with the Releaser capability,
// "plain" one without it (or with it hidden).
var LifecycleGoals = map[string]map[string]int{
	"releaser": {"claim": 2, "takeover": 2, "commit": 1, "release": 1},
	"plain":    {"claim": 2, "takeover": 2, "commit": 1, "release": 2},
}

// MeasureLifecycle counts the store calls real coordinators make on one
// split's keys over a store of mk, step by step, and fails t when a step
// costs more than [LifecycleGoals] allows:
//
//   - claim: a split handed back is claimed by a peer with the lease
//     create and the epoch-bumping compare-and-swap, 2 calls;
//   - takeover: a dead owner's split is claimed with the lease create and
//     the compare-and-swap on the record it viewed (a read only if that
//     loses), 2 calls;
//   - commit: one compare-and-swap;
//   - release: a drained hand-back is one UpdateAndDelete on a store with
//     the Releaser capability ([spate.ReleaserOf]), and the owner-clear
//     and the lease delete, 2 calls, without it.
//
// Each worker's store is wrapped in a counter that passes the Releaser
// capability on. On a store with it, the measurement runs twice: as the
// store is ("releaser") and with the capability hidden ("plain"); on a
// store without it, once ("plain"), and it says so. Lease renewals (an
// update of the split's ephemeral key by its holder) are left out of the
// counts. It logs one line per step, "lifecycle <mode> <step>=<n>", which
// internal/perfreport reads, and the calls behind each count.
//
// A step measured while a lease renewal, which runs on its own clock, got
// into it, or while a peer's two watches delivered a release's changes
// out of order, is measured again (up to three attempts); on the last
// attempt a claim that took that late-release path is judged without the
// lost compare-and-swap and the read that are its price.
//
// The coordinators are the conformance suite's own fleet, which is why
// the code lives in package conformance; it is measurement, not a rule
// of the contract.
func MeasureLifecycle(t *testing.T, mk conformance.HarnessMaker) {
	t.Helper()
	hook.Lifecycle(t, mk, LifecycleGoals)
}
