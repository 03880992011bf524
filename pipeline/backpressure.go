package pipeline

import (
	"math"
	"sync/atomic"
	"time"
)

// inflightBudget counts the bytes between the chain terminals and durable
// sink writes: a terminal adds a chunk's size when it seals it (a parked
// chunk counts), a sink worker subtracts it when the chunk's batch settles
// or is abandoned. It is a gauge for backpressure, not a lock: adds never
// block and never fail.
type inflightBudget struct {
	used atomic.Int64
	max  int64
}

// newInflightBudget returns a budget whose capacity is maxBytes (at least 1).
func newInflightBudget(maxBytes int64) *inflightBudget {
	return &inflightBudget{max: max(maxBytes, 1)}
}

// Add counts n more bytes in flight (saturating).
func (b *inflightBudget) Add(n int64) {
	if n <= 0 {
		return
	}
	for {
		cur := b.used.Load()
		next := cur + n
		if next < cur {
			next = math.MaxInt64
		}
		if b.used.CompareAndSwap(cur, next) {
			return
		}
	}
}

// Sub counts n bytes settled; usage never goes below zero.
func (b *inflightBudget) Sub(n int64) {
	if n <= 0 {
		return
	}
	for {
		cur := b.used.Load()
		next := max(cur-n, 0)
		if b.used.CompareAndSwap(cur, next) {
			return
		}
	}
}

// Usage is the bytes in flight.
func (b *inflightBudget) Usage() int64 { return b.used.Load() }

// Max is the budget's capacity.
func (b *inflightBudget) Max() int64 { return b.max }

// bpParams are a runner's pause and resume thresholds.
type bpParams struct {
	high, low int64
	minPause  time.Duration
}

func newBPParams(maxBytes int64, highRatio, lowRatio float64, minPause time.Duration) bpParams {
	high := max(int64(math.Floor(float64(maxBytes)*highRatio)), 1)
	low := int64(math.Floor(float64(maxBytes) * lowRatio))
	return bpParams{high: high, low: low, minPause: minPause}
}

type bpTransition uint8

const (
	bpNone bpTransition = iota
	bpPause
	bpResume
)

// watermarkController is one runner's hysteresis between pausing and
// resuming: it pauses on a rejected send or when usage reaches the high
// mark, and resumes only once usage is at or below the low mark, every sink
// queue is below its low fill, and the pause lasted at least minPause.
// Transitions strictly alternate.
type watermarkController struct {
	p        bpParams
	now      func() time.Time
	paused   bool
	since    time.Time
	rejected bool
}

func newWatermarkController(p bpParams, now func() time.Time) *watermarkController {
	if now == nil {
		now = time.Now
	}
	return &watermarkController{p: p, now: now}
}

// onSendRejected notes a send the sink refused; while paused it restarts
// the pause timer (congestion continues).
func (w *watermarkController) onSendRejected() {
	w.rejected = true
	if w.paused {
		w.since = w.now()
	}
}

func (w *watermarkController) tick(usage int64, queuesLow bool) bpTransition {
	if !w.paused {
		if w.rejected || usage >= w.p.high {
			w.rejected = false
			w.paused = true
			w.since = w.now()
			return bpPause
		}
		return bpNone
	}
	if w.rejected {
		// One rejection must not count against two ticks.
		w.rejected = false
		return bpNone
	}
	if usage <= w.p.low && queuesLow && w.now().Sub(w.since) >= w.p.minPause {
		w.paused = false
		return bpResume
	}
	return bpNone
}
