package spate

import "time"

// timings are the coordinator's derived durations, in one table and
// computed once, by NewStoreCoordinator, from the validated Config. Each
// is a function of the lease, the op timeout or the drain deadline; the
// reason for each sits beside it. The Config's own timings (OpTimeout,
// ReconcileInterval, ReplanInterval, DrainDeadline) are the ones a user
// may set, and TimingsForLease derives them from the lease; these are
// the ones nobody sets.
type timings struct {
	// tick is how often the loop wakes with no event, for the decisions
	// that fall due on time alone (drain deadlines, delay windows, the
	// settle window, a snapshot that never completes):
	// max(min(lease/6, drain/4), 10 ms).
	tick time.Duration
	// retry is how long an operation that failed on a store error waits
	// before the loop tries it again: a failed write's answer is itself an
	// event, and retrying on it at once would spin against a store that is
	// down. max(lease/20, 50 ms).
	retry time.Duration
	// releaseSettle is how long the claim scan leaves alone a split whose
	// lease delete a watch delivered moments ago while its record still
	// names the owner. A release is two changes on two watch streams even
	// when one UpdateAndDelete makes both, and the lease's often arrives
	// first; taking the split then as an expired one costs a lost
	// compare-and-swap and a read (4 store calls, not 2). A dead owner's
	// takeover waits this much more after a whole lease. min(lease/20,
	// 100 ms).
	releaseSettle time.Duration
	// rewatchJitter bounds the random part of the wait before a broken
	// watch is reopened: when a store restarts, every worker's watch
	// breaks at once, and their re-snapshots are spread over this window
	// instead of arriving together. A quarter lease, at most 5 s: with a
	// tenth (1 s at a 10 s lease), 50 workers' ~100 NATS key watches
	// re-opened faster than the server could set them up (5-69 per run
	// outlasted the op timeout) and the leader's whole-job snapshot was
	// given up in 5 of 6 runs; with a quarter, 0-2 and none in 3 runs.
	rewatchJitter time.Duration
	// snapshotBudget bounds how long a watch snapshot may take to arrive:
	// 3 × OpTimeout.
	snapshotBudget time.Duration
	// settleQuiet is how long a new job's membership must stay unchanged
	// before the first assignment: long enough for workers started
	// together to announce themselves (each arrival starts it again), short
	// enough that a lone worker starts at once. min(250 ms, lease/10):
	// three workers launched together announced themselves within the same
	// 100 ms, and the 1 s this was before was most of a lone worker's time
	// to its first split (docs/decisions/052).
	settleQuiet time.Duration
	// settleCap bounds a new job's whole settle window: lease/3.
	settleCap time.Duration
	// pin bounds how long a move may stay in flight, pinned to its
	// destination: long enough for the holder to drain it (DrainDeadline)
	// and the destination to notice and claim it; a destination that has
	// not claimed it by then is passed over. drain + lease.
	pin time.Duration
	// beat is the renewer's mean interval, lease/3; each beat is jittered
	// to 0.8-1.2 of it (renewer.beatInterval).
	beat time.Duration
	// renewRetry is how long a renewal that failed Retryable waits before
	// its one retry within the beat: a lost reply or a store hiccup then
	// costs a moment, not a third of the lease. lease/15.
	renewRetry time.Duration
	// renewGate skips a lease renewal written less than this long ago, so
	// a split claimed just before a beat is not rewritten at once. With
	// beats every 0.8-1.2 × lease/3, a lease is rewritten at least every
	// ~0.63 lease. 0.7 × lease/3.
	renewGate time.Duration
	// list bounds a List, whose cost grows with the keyspace (N+1 round
	// trips on some backends): max(3 × OpTimeout, lease/3).
	list time.Duration
	// command bounds how long a command of the handle waits for the loop's
	// answer: 3 × OpTimeout.
	command time.Duration
	// directRelease bounds Close's direct hand-back of what is still held:
	// 2 × OpTimeout.
	directRelease time.Duration
}

// deriveTimings computes the table from a validated Config.
func deriveTimings(c Config) timings {
	lease, op, drain := c.LeaseDuration, c.OpTimeout, c.DrainDeadline
	return timings{
		tick:           max(min(lease/6, drain/4), 10*time.Millisecond),
		retry:          max(lease/20, 50*time.Millisecond),
		releaseSettle:  min(lease/20, 100*time.Millisecond),
		rewatchJitter:  min(lease/4, 5*time.Second),
		snapshotBudget: 3 * op,
		settleQuiet:    min(250*time.Millisecond, lease/10),
		settleCap:      lease / 3,
		pin:            drain + lease,
		beat:           lease / 3,
		renewRetry:     lease / 15,
		renewGate:      lease / 3 * 7 / 10,
		list:           max(3*op, lease/3),
		command:        3 * op,
		directRelease:  2 * op,
	}
}
