package conformance

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
)

// The boundary between a watch's snapshot and its live stream is where two
// defects hide that a rule only sees if writes land while the watch is
// being set up:
//
//   - a live subscription made after the snapshot read: writes between
//     the two are never delivered (a gap);
//   - a live stream that starts before the snapshot's revision: a key's
//     revision older than the one its snapshot entry carried arrives after
//     SnapshotDone (out of revision order).
//
// boundaryRun opens a watch while a writer writes back to back, and keeps
// writing until the watch call has returned (past its bound of writes,
// updates only) and its SnapshotDone arrived, and a while after. Every
// other write creates a key written once (a lost create is never
// superseded, so a gap shows as a key never delivered); the rest update a
// few fixed keys (so a rewind shows as an older revision after a newer
// one). A run proves it exercised the boundary only if some write both
// started after the watch was asked for and completed before its
// SnapshotDone was received; boundaryCheck retries a run that did not, and
// fails the rule if none did.

// Moments are counted, not timed (the suite may run in a synctest bubble,
// where time stands still while goroutines run): every write's start and
// end, the watch's asking and its SnapshotDone take a number from one
// counter.
type boundaryWrite struct {
	key        string
	rev        uint64
	start, end int64
}

type boundaryResult struct {
	events   []spate.WatchEvent
	writes   []boundaryWrite
	asked    int64 // the watch was asked for
	snapDone int64 // its SnapshotDone was received (0: not yet)
	err      error
}

// boundaryMaxWrites bounds a run's writes, so that a slow watch setup on a
// fast store cannot bury the watcher.
const boundaryMaxWrites = 1200

// inWindow counts the writes concurrent with the watch's setup: under
// way at some moment between the watch being asked for and its
// SnapshotDone being received. (A store whose setup is atomic, as the
// in-memory one, has no gap to find, but a writer that never paused is
// still shown to have run through it.)
func (r boundaryResult) inWindow() int {
	n := 0
	for _, w := range r.writes {
		if w.start < r.snapDone && w.end > r.asked {
			n++
		}
	}
	return n
}

// boundaryRun runs one attempt. fixed keys exist (created here) before the
// watch; created are the keys the writer creates, in order. open opens the
// watch over all of them.
//
// late are keys created only once the writer ran out of its bound and the
// watch's SnapshotDone arrived: one create each, never coalesced, so the
// watcher is sure of live events to count even when every bounded write
// landed before its snapshot was read.
//
// spare are keys the writer creates past its bound, between updates of the
// fixed keys, while the watch call has not returned: a create there that
// a defect loses is never superseded either.
func boundaryRun(e *env, w spate.Store, fixed, created, late, spare []string, open func() <-chan spate.WatchEvent) boundaryResult {
	revs := map[string]uint64{}
	for _, k := range fixed {
		revs[k] = mustCreate(e, w, spate.Durable, k, "0")
	}
	var (
		mu     sync.Mutex
		writes []boundaryWrite
		werr   error
	)
	var clock atomic.Int64
	stop := make(chan struct{})
	started := make(chan struct{})
	asking := make(chan struct{})  // the watch is being asked for: write on
	snapped := make(chan struct{}) // the watcher received SnapshotDone
	opened := make(chan struct{})  // the watch call returned
	var wg sync.WaitGroup
	wg.Go(func() {
		next := 0
		// write makes one write (an update of a fixed key, or a create)
		// and records it; false when it failed, werr saying why.
		write := func(k string, create bool, v string) bool {
			start := clock.Add(1)
			var o spate.Outcome
			var err error
			if create {
				o, err = w.Create(e.ctx, spate.Durable, k, []byte(v))
			} else {
				o, err = w.Update(e.ctx, spate.Durable, k, []byte(v), revs[k])
			}
			if err != nil || !o.Won {
				mu.Lock()
				werr = fmt.Errorf("write %s: won=%t err=%v", k, o.Won, err)
				mu.Unlock()
				return false
			}
			revs[k] = o.Revision
			mu.Lock()
			writes = append(writes, boundaryWrite{key: k, rev: o.Revision, start: start, end: clock.Add(1)})
			mu.Unlock()
			return true
		}
		// writeUntilOpened goes on past the bound until the watch call has
		// returned (creates of spare keys while they last, between updates
		// of the fixed keys), so that the writes span the whole of the
		// watch's setup however slow it is: a writer that ran out first,
		// under load, let a setup defect slip through a run that looked
		// exercised. False: stopped, or a write failed.
		writeUntilOpened := func(j int) bool {
			for s := 0; ; j++ {
				select {
				case <-opened:
					return true
				case <-stop:
					return false
				default:
				}
				runtime.Gosched()
				var ok bool
				if j%2 == 0 && s < len(spare) {
					s++
					ok = write(spare[s-1], true, "v")
				} else {
					ok = write(fixed[j%len(fixed)], false, fmt.Sprint(j))
				}
				if !ok {
					return false
				}
			}
		}
		defer func() {
			select {
			case <-started:
			default:
				close(started)
			}
		}()
		for i := 0; i < boundaryMaxWrites+len(late); i++ {
			if i == boundaryMaxWrites {
				if !writeUntilOpened(i) {
					return
				}
				select {
				case <-snapped:
				case <-stop:
					return
				}
			}
			if i == 8 {
				close(started)
				select {
				case <-asking:
				case <-stop:
					return
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			runtime.Gosched() // let the watcher's setup run between writes
			ok := false
			switch {
			case i >= boundaryMaxWrites:
				ok = write(late[i-boundaryMaxWrites], true, "v")
			case i%2 == 0 && next < len(created):
				next++
				ok = write(created[next-1], true, "v")
			default:
				ok = write(fixed[(i/2)%len(fixed)], false, fmt.Sprint(i))
			}
			if !ok {
				return
			}
		}
	})
	<-started
	r := boundaryResult{asked: clock.Add(1)}
	close(asking)
	ch := open()
	close(opened)
	deadline := time.After(30 * time.Second)
	var after int
	stopped := false
	for !stopped {
		select {
		case ev, ok := <-ch:
			if !ok {
				r.err = fmt.Errorf("the watch closed during the run")
				stopped = true
				break
			}
			if ev.Kind == spate.WatchError {
				r.err = fmt.Errorf("the watch broke: %v", ev.Err)
				stopped = true
				break
			}
			r.events = append(r.events, ev)
			if ev.Kind == spate.WatchSnapshotDone && r.snapDone == 0 {
				r.snapDone = clock.Add(1)
				close(snapped)
			}
			if r.snapDone == 0 {
				// Let the writer run while the snapshot streams in: a store
				// that sends it as the consumer reads must keep every write
				// it lets through.
				runtime.Gosched()
			}
			if r.snapDone != 0 {
				if after++; after >= 40 {
					stopped = true
				}
			}
		case <-deadline:
			r.err = fmt.Errorf("no SnapshotDone and 40 live events within 30s")
			stopped = true
		}
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	r.writes = writes
	if werr != nil && r.err == nil {
		r.err = werr
	}
	mu.Unlock()
	if r.err != nil {
		return r
	}
	// Read on until every key's last write has been delivered, or a while
	// passed: what is missing then is a gap.
	last := map[string]uint64{}
	for _, w := range r.writes {
		last[w.key] = w.rev
	}
	seen := map[string]uint64{}
	for _, ev := range r.events {
		if ev.Kind == spate.WatchPut {
			seen[ev.Key] = max(seen[ev.Key], ev.Revision)
		}
	}
	converged := func() bool {
		for k, rev := range last {
			if seen[k] < rev {
				return false
			}
		}
		return true
	}
	quiet := time.After(10 * time.Second)
	for !converged() {
		select {
		case ev, ok := <-ch:
			if !ok || ev.Kind == spate.WatchError {
				return r
			}
			r.events = append(r.events, ev)
			if ev.Kind == spate.WatchPut {
				seen[ev.Key] = max(seen[ev.Key], ev.Revision)
			}
		case <-quiet:
			return r
		}
	}
	return r
}

// boundaryCheck runs boundaryRun (up to 5 attempts, each on keys of its
// own under prefix) until one exercised the boundary, and checks it: with
// gaps, that every write's key reached the watcher at that write's
// revision or a later one; with order, that no key's revision went back.
func boundaryCheck(e *env, w spate.Store, prefix string, open func(keys []string) <-chan spate.WatchEvent, gaps, order bool) {
	for attempt := range 5 {
		var fixed, created []string
		for i := range 4 {
			fixed = append(fixed, fmt.Sprintf("%s%d.f%d", prefix, attempt, i))
		}
		var late []string
		for i := range 400 {
			created = append(created, fmt.Sprintf("%s%d.n%03d", prefix, attempt, i))
		}
		for i := range 60 {
			late = append(late, fmt.Sprintf("%s%d.l%02d", prefix, attempt, i))
		}
		var spare []string
		for i := range 400 {
			spare = append(spare, fmt.Sprintf("%s%d.s%03d", prefix, attempt, i))
		}
		all := slices.Concat(fixed, created, late, spare)
		r := boundaryRun(e, w, fixed, created, late, spare, func() <-chan spate.WatchEvent { return open(all) })
		if r.err != nil {
			e.t.Fatalf("boundary: %v", r.err)
		}
		if r.inWindow() == 0 {
			continue // the writer made no write inside the watch's setup: try again
		}
		if gaps {
			seen := map[string]uint64{}
			for _, ev := range r.events {
				if ev.Kind == spate.WatchPut {
					seen[ev.Key] = max(seen[ev.Key], ev.Revision)
				}
			}
			missing := 0
			first := ""
			last := map[string]uint64{}
			for _, wr := range r.writes {
				last[wr.key] = wr.rev
			}
			for k, rev := range last {
				if seen[k] < rev {
					if missing++; first == "" {
						first = fmt.Sprintf("%s (written at revision %d, last delivered %d)", k, rev, seen[k])
					}
				}
			}
			if missing > 0 {
				e.t.Fatalf("rule: there are no gaps, across the boundary between snapshot and live stream too; but at that boundary %d keys never reached the watcher at their last revision, e.g. %s; %d writes ran while the watch was being set up",
					missing, first, r.inWindow())
			}
		}
		if order {
			high := map[string]uint64{}
			for _, ev := range r.events {
				if ev.Kind != spate.WatchPut && ev.Kind != spate.WatchDelete {
					continue
				}
				if ev.Revision < high[ev.Key] {
					e.t.Fatalf("rule: events of one key arrive in revision order; but key %s's revision %d arrived after its revision %d (%d writes ran while the watch was being set up)",
						ev.Key, ev.Revision, high[ev.Key], r.inWindow())
				}
				high[ev.Key] = ev.Revision
			}
		}
		e.t.Logf("boundary: %d writes ran while the watch was being set up", r.inWindow())
		return
	}
	e.t.Fatalf("boundary: in 5 runs no write ran while the watch was being set up: the rule could not exercise the boundary between snapshot and live stream")
}
