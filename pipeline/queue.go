package pipeline

import (
	"sync"
	"time"
)

// mpsc is an unbounded multi-producer queue. Push never blocks: control
// traffic, runner events and acknowledgments must never stall a poll loop
// (a buffered channel would block its sender when full).
type mpsc[T any] struct {
	mu     sync.Mutex
	items  []T
	notify chan struct{} // one slot: "something was pushed"
}

func newMPSC[T any]() *mpsc[T] { return &mpsc[T]{notify: make(chan struct{}, 1)} }

// Push appends v. It never blocks.
func (q *mpsc[T]) Push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// TryPop removes the oldest item, if any.
func (q *mpsc[T]) TryPop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var zero T
	if len(q.items) == 0 {
		return zero, false
	}
	v := q.items[0]
	q.items[0] = zero
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let a drained backing array go
	}
	return v, true
}

// PopWait removes the oldest item, waiting up to timeout for one.
func (q *mpsc[T]) PopWait(timeout time.Duration) (T, bool) {
	if v, ok := q.TryPop(); ok {
		return v, true
	}
	if timeout <= 0 {
		var zero T
		return zero, false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-q.notify:
			if v, ok := q.TryPop(); ok {
				return v, true
			}
		case <-t.C:
			return q.TryPop()
		}
	}
}

// DrainInto appends every queued item to dst and empties the queue.
func (q *mpsc[T]) DrainInto(dst []T) []T {
	q.mu.Lock()
	dst = append(dst, q.items...)
	clear(q.items)
	q.items = q.items[:0]
	q.mu.Unlock()
	return dst
}

// Len is the number of queued items.
func (q *mpsc[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
