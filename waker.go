package spate

// Waker wakes a coordinated source's control-plane wait.
//
// It is cheap to copy and safe to signal from any goroutine, including one
// on the data path, because [Waker.Wake] never blocks. The channel behind it
// holds a single slot: a burst of signals collapses into one wakeup, and a
// signal that lands while the waiter is between its check and its park is
// buffered rather than lost.
//
// Signal it for anything the waiter would otherwise only notice between
// waits: a coordinator with events ready, a lane reaching end of input, a
// lane reporting poison. Make the state visible first, then wake.
//
// The zero Waker is inert: Wake does nothing and C returns nil (a nil
// channel never fires in a select).
type Waker struct{ c chan struct{} }

// NewWaker returns a waker with its one-slot channel. The party that parks
// receives from [Waker.C].
func NewWaker() Waker { return Waker{c: make(chan struct{}, 1)} }

// InertWaker returns a waker attached to nothing, whose Wake is a no-op: for
// unit tests that build a lane without a driver, and for sources with no
// control-plane wait to interrupt. It is the zero Waker.
func InertWaker() Waker { return Waker{} }

// Wake makes the waiter's current or next park return immediately. It never
// blocks.
func (w Waker) Wake() {
	select {
	case w.c <- struct{}{}:
	default: // a wakeup is already pending (or the waker is inert)
	}
}

// C is the channel the waiter parks on. Receiving consumes the pending
// wakeup.
func (w Waker) C() <-chan struct{} { return w.c }
