// Package casload drives compare-and-swap increments of one counter key
// from several clients while a test breaks the store under them (a
// leader killed, a node stopped), records every call for the
// linearizability check (conformance.History) and counts what the
// clients know: the increments that won, and those whose outcome a
// failure left unknown. The drivers' failover tests share it.
package casload

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
)

// Key is the counter's key, in the durable keyspace. The test creates it
// (with value "0") before Start.
const Key = "ctr"

// opTimeout bounds each call: a call to a node that just died fails
// within it and the client tries again.
const opTimeout = 2 * time.Second

// Load is the running clients.
type Load struct {
	t        testing.TB
	won      atomic.Int64
	unknown  atomic.Int64
	failed   atomic.Int64
	progress chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	mu   sync.Mutex
	wins []time.Time // when each increment was seen to win
}

// Start runs one client per store, numbered by its index in the
// history, until Stop. Each reads the counter and writes it plus one at
// the revision it read. A failed call must be Retryable (the test fails
// otherwise) and is retried after a short pause.
func Start(t testing.TB, ctx context.Context, rec *conformance.History, stores []spate.Store) *Load {
	l := &Load{t: t, progress: make(chan struct{}, 1), stop: make(chan struct{})}
	for id, s := range stores {
		l.wg.Go(func() { l.client(ctx, rec, id, s) })
	}
	t.Cleanup(l.Stop)
	return l
}

func (l *Load) client(ctx context.Context, rec *conformance.History, id int, s spate.Store) {
	for !l.stopped() {
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		en, ok, err := conformance.Recorder{H: rec, Client: id, Store: s}.Get(gctx, spate.Durable, Key)
		cancel()
		switch {
		case err != nil:
			l.failed.Add(1)
			if !spate.IsRetryable(err) {
				l.t.Errorf("client %d: a failover error must be Retryable; get returned %v", id, err)
				return
			}
			l.pause()
			continue
		case !ok:
			l.t.Errorf("client %d: the counter vanished", id)
			return
		}
		v, err := strconv.Atoi(string(en.Value))
		if err != nil {
			l.t.Errorf("client %d: counter value %q: %v", id, en.Value, err)
			return
		}
		uctx, cancel := context.WithTimeout(ctx, opTimeout)
		o, err := conformance.Recorder{H: rec, Client: id, Store: s}.Update(uctx, spate.Durable, Key, []byte(strconv.Itoa(v+1)), en.Revision)
		cancel()
		switch {
		case err != nil:
			l.unknown.Add(1)
			if !spate.IsRetryable(err) {
				l.t.Errorf("client %d: a failover error must be Retryable; update returned %v", id, err)
				return
			}
			l.pause()
		case o.Won:
			l.won.Add(1)
			l.mu.Lock()
			l.wins = append(l.wins, time.Now())
			l.mu.Unlock()
			select {
			case l.progress <- struct{}{}:
			default:
			}
		}
	}
}

func (l *Load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// pause waits a little after a failed call (not a wait for a condition: a
// failover has no event a client could wait on).
func (l *Load) pause() {
	select {
	case <-l.stop:
	case <-time.After(50 * time.Millisecond):
	}
}

// WaitWon waits until n increments have won, failing the test (after
// stopping the clients) when no increment wins for stuck.
func (l *Load) WaitWon(n int64, stuck time.Duration, what string) {
	l.t.Helper()
	for l.won.Load() < n {
		select {
		case <-l.progress:
		case <-time.After(stuck):
			l.Stop()
			l.t.Fatalf("%s: stuck at %d won increments (want %d)", what, l.won.Load(), n)
		}
	}
}

// Stop ends the clients and waits for them. It may be called again.
func (l *Load) Stop() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// Won is the number of increments that won.
func (l *Load) Won() int64 { return l.won.Load() }

// Unknown is the number of updates whose call failed: each may or may not
// have applied.
func (l *Load) Unknown() int64 { return l.unknown.Load() }

// Failed is the number of reads that failed.
func (l *Load) Failed() int64 { return l.failed.Load() }

// FirstWinAfter is how long after t0 the first increment won (0: none
// did).
func (l *Load) FirstWinAfter(t0 time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.wins {
		if w.After(t0) {
			return w.Sub(t0)
		}
	}
	return 0
}

// CheckFinal requires the counter's final value to hold every won
// increment and nothing but won or unknown ones.
func (l *Load) CheckFinal(final int) {
	l.t.Helper()
	w, u := l.won.Load(), l.unknown.Load()
	if int64(final) < w {
		l.t.Errorf("rule: no won increment is lost across a failover; the counter reads %d after %d won and %d unknown increments", final, w, u)
	}
	if int64(final) > w+u {
		l.t.Errorf("rule: only won or unknown updates can have applied; the counter reads %d after %d won and %d unknown increments", final, w, u)
	}
}
