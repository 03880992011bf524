package spate

import "sync"

// signalQueue is an unbounded queue with a one-slot signal: put never
// blocks its sender, however busy the receiver, and a burst of puts
// leaves one signal. The receiver selects on sig and then takes
// everything queued, in order. The loop's continuations (loopIO.results)
// and the renewer's notes to the loop (renewer.notes) travel on one each.
type signalQueue[T any] struct {
	mu  sync.Mutex
	q   []T
	sig chan struct{}
}

// newSignalQueue returns an empty queue.
func newSignalQueue[T any]() *signalQueue[T] {
	return &signalQueue[T]{sig: make(chan struct{}, 1)}
}

// put appends v and signals, unless a signal is already pending.
func (s *signalQueue[T]) put(v T) {
	s.mu.Lock()
	s.q = append(s.q, v)
	s.mu.Unlock()
	select {
	case s.sig <- struct{}{}:
	default:
	}
}

// take returns everything queued, oldest first, and empties the queue.
func (s *signalQueue[T]) take() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	s.q = nil
	return q
}
