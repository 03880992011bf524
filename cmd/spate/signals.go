package main

import (
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
)

// interrupts handles SIGINT and SIGTERM: the first one calls onFirst (a
// graceful stop); a second one exits the process at once, unless hold is
// set, in which case the caller watches count.
type interrupts struct {
	ch    chan os.Signal
	count atomic.Int32
	hold  atomic.Bool
	mu    sync.Mutex
	first os.Signal
	done  chan struct{}
	// notify receives a value after every signal (coalesced).
	notify chan struct{}
}

func watchSignals(onFirst func(os.Signal), onSecond func(os.Signal)) *interrupts {
	i := &interrupts{ch: make(chan os.Signal, 4), done: make(chan struct{}), notify: make(chan struct{}, 1)}
	signal.Notify(i.ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer close(i.done)
		for sig := range i.ch {
			n := i.count.Add(1)
			select {
			case i.notify <- struct{}{}:
			default:
			}
			if n == 1 {
				i.mu.Lock()
				i.first = sig
				i.mu.Unlock()
				onFirst(sig)
				continue
			}
			if i.hold.Load() {
				continue
			}
			if onSecond != nil {
				onSecond(sig)
			}
			os.Exit(signalCode(sig))
		}
	}()
	return i
}

// stop stops watching.
func (i *interrupts) stop() {
	signal.Stop(i.ch)
	close(i.ch)
	<-i.done
}

// signal is the first signal received, nil if none.
func (i *interrupts) signal() os.Signal {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.first
}

// signalCode is the conventional exit code after sig: 128 + its number.
func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitFailed
}
