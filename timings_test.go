package spate

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The derived timings keep the relations the protocol leans on, at every
// lease the product accepts.
func TestDerivedTimingsKeepTheirRelations(t *testing.T) {
	for _, lease := range []time.Duration{MinLeaseDuration, time.Second, 3 * time.Second, 15 * time.Second, time.Minute, 10 * time.Minute} {
		cfg := TimingsForLease(lease)
		cfg.InstanceID = "me"
		cfg = cfg.WithDefaults()
		tm := deriveTimings(cfg)
		at := fmt.Sprintf("lease %v", lease)
		// A lease renewed at the shortest beat is not skipped by the gate,
		// and the retry of a failed renewal lands within that beat.
		assert.Less(t, tm.renewGate, tm.beat*8/10, at)
		assert.Less(t, tm.renewRetry, tm.beat*8/10, at)
		// The longest beat plus one retry still renews before the lease ends.
		assert.Less(t, tm.beat*12/10+tm.renewRetry, lease, at)
		// The loop wakes often enough for drain deadlines and the settle window.
		assert.LessOrEqual(t, tm.tick, max(cfg.DrainDeadline/4, 10*time.Millisecond), at)
		assert.LessOrEqual(t, tm.tick, max(lease/6, 10*time.Millisecond), at)
		// A move's pin outlasts the drain it waits for.
		assert.Greater(t, tm.pin, cfg.DrainDeadline, at)
		// Waiting on a release echo costs a takeover a sliver of the lease.
		assert.LessOrEqual(t, tm.releaseSettle, lease/20, at)
		// A listing gets at least a single call's budget; a command waits
		// longer than the call it may be queued behind.
		assert.GreaterOrEqual(t, tm.list, cfg.OpTimeout, at)
		assert.Greater(t, tm.command, cfg.OpTimeout, at)
		assert.Greater(t, tm.snapshotBudget, cfg.OpTimeout, at)
		// A new job's settle window ends within its cap.
		assert.LessOrEqual(t, tm.settleQuiet, tm.settleCap, at)
	}
}
