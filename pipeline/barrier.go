package pipeline

import (
	"sync"
	"sync/atomic"
	"time"
)

// drainBarrier is a countdown shared by every party of a drain: created with
// N parties, each calls [drainBarrier.Arrive] exactly once, and waiters are
// released when the count reaches zero. A barrier of zero parties is
// complete from the start. It is safe for concurrent use; copy the pointer.
type drainBarrier struct {
	remaining atomic.Int64
	done      chan struct{}
	once      sync.Once
}

// newDrainBarrier returns a barrier waiting for n parties.
func newDrainBarrier(n int) *drainBarrier {
	b := &drainBarrier{done: make(chan struct{})}
	b.remaining.Store(int64(n))
	if n <= 0 {
		b.once.Do(func() { close(b.done) })
	}
	return b
}

// Arrive records one party's arrival. Arrivals past the party count are
// ignored.
func (b *drainBarrier) Arrive() {
	if b.remaining.Add(-1) == 0 {
		b.once.Do(func() { close(b.done) })
	}
}

// Wait reports whether every party arrived within timeout. Waiting on a
// complete barrier returns true at once.
func (b *drainBarrier) Wait(timeout time.Duration) bool {
	select {
	case <-b.done:
		return true
	default:
	}
	if timeout <= 0 {
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-b.done:
		return true
	case <-t.C:
		return b.Done()
	}
}

// Done reports whether every party arrived.
func (b *drainBarrier) Done() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// C is closed once every party arrived.
func (b *drainBarrier) C() <-chan struct{} { return b.done }

// Remaining reports the parties still missing (never negative).
func (b *drainBarrier) Remaining() int { return int(max(b.remaining.Load(), 0)) }
