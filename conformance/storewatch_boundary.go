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

// writePace is the writer's wait between the writes it makes past its
// bound while the watch call has not returned (writeUntilOpened).
const writePace = 50 * time.Microsecond

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
	bw := &boundaryWriter{e: e, w: w, fixed: fixed, created: created, late: late, spare: spare, revs: map[string]uint64{},
		stop: make(chan struct{}), started: make(chan struct{}), asking: make(chan struct{}),
		snapped: make(chan struct{}), opened: make(chan struct{})}
	for _, k := range fixed {
		bw.revs[k] = mustCreate(e, w, spate.Durable, k, "0")
	}
	var wg sync.WaitGroup
	wg.Go(bw.run)
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(bw.stop)
			wg.Wait()
		}
	}
	// A rule that fails in open (a watch call that did not return within
	// its bound, bound.go) leaves no writer behind.
	defer halt()
	<-bw.started
	r := boundaryResult{asked: bw.clock.Add(1)}
	close(bw.asking)
	ch := open()
	close(bw.opened)
	r.readThroughSnapshot(ch, bw)
	halt()
	bw.mu.Lock()
	r.writes = bw.writes
	if bw.err != nil && r.err == nil {
		r.err = bw.err
	}
	bw.mu.Unlock()
	if r.err == nil {
		r.readUntilConverged(ch)
	}
	return r
}

// boundaryWriter is a run's writer. Its phases, in order: writes up to the
// eighth (then it waits for the watch to be asked for), the rest of its
// bound, writes on until the watch call returned (writeUntilOpened), and
// once SnapshotDone arrived the late creates.
type boundaryWriter struct {
	e                           *env
	w                           spate.Store
	fixed, created, late, spare []string
	revs                        map[string]uint64 // the writer's, and before it starts boundaryRun's

	clock atomic.Int64 // the run's moments (boundaryWrite)

	stop    chan struct{} // the watcher is done: stop writing
	started chan struct{} // the writer is under way: ask for the watch
	asking  chan struct{} // the watch is being asked for: write on
	snapped chan struct{} // the watcher received SnapshotDone
	opened  chan struct{} // the watch call returned

	mu     sync.Mutex
	writes []boundaryWrite
	err    error // why a write failed
}

func (bw *boundaryWriter) run() {
	defer func() {
		select {
		case <-bw.started:
		default:
			close(bw.started)
		}
	}()
	next := 0
	for i := 0; i < boundaryMaxWrites+len(bw.late); i++ {
		if i == boundaryMaxWrites {
			if !bw.writeUntilOpened(i) || !bw.wait(bw.snapped) {
				return
			}
		}
		if i == 8 {
			close(bw.started)
			if !bw.wait(bw.asking) {
				return
			}
		}
		if bw.stopped() {
			return
		}
		runtime.Gosched() // let the watcher's setup run between writes
		ok := false
		switch {
		case i >= boundaryMaxWrites:
			ok = bw.write(bw.late[i-boundaryMaxWrites], true, "v")
		case i%2 == 0 && next < len(bw.created):
			next++
			ok = bw.write(bw.created[next-1], true, "v")
		default:
			ok = bw.write(bw.fixed[(i/2)%len(bw.fixed)], false, fmt.Sprint(i))
		}
		if !ok {
			return
		}
	}
}

// wait waits for ch to close; false when the run stopped first.
func (bw *boundaryWriter) wait(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-bw.stop:
		return false
	}
}

func (bw *boundaryWriter) stopped() bool {
	select {
	case <-bw.stop:
		return true
	default:
		return false
	}
}

// write makes one write (an update of a fixed key, or a create) and
// records it; false when it failed, bw.err saying why.
func (bw *boundaryWriter) write(k string, create bool, v string) bool {
	start := bw.clock.Add(1)
	var o spate.Outcome
	var err error
	if create {
		o, err = bw.w.Create(bw.e.ctx, spate.Durable, k, []byte(v))
	} else {
		o, err = bw.w.Update(bw.e.ctx, spate.Durable, k, []byte(v), bw.revs[k])
	}
	bw.mu.Lock()
	defer bw.mu.Unlock()
	if err != nil || !o.Won {
		bw.err = fmt.Errorf("write %s: won=%t err=%v", k, o.Won, err)
		return false
	}
	bw.revs[k] = o.Revision
	bw.writes = append(bw.writes, boundaryWrite{key: k, rev: o.Revision, start: start, end: bw.clock.Add(1)})
	return true
}

// writeUntilOpened goes on past the bound until the watch call has
// returned (creates of spare keys while they last, between updates of the
// fixed keys), so that the writes span the whole of the watch's setup
// however slow it is: a writer that ran out first, under load, let a setup
// defect slip through a run that looked exercised. False: stopped, or a
// write failed.
//
// Between these writes it waits writePace on a timer, never merely
// yielding: in the suite's synctest bubble a writer that never blocks
// keeps virtual time from moving, so a driver whose Watch waits on a timer
// (a back-off, a millisecond before it subscribes) never returned, and the
// rule ran until the test binary's timeout.
func (bw *boundaryWriter) writeUntilOpened(j int) bool {
	pace := time.NewTimer(0)
	defer pace.Stop()
	for s := 0; ; j++ {
		select {
		case <-bw.opened:
			return true
		case <-bw.stop:
			return false
		case <-pace.C:
		}
		pace.Reset(writePace)
		var ok bool
		if j%2 == 0 && s < len(bw.spare) {
			s++
			ok = bw.write(bw.spare[s-1], true, "v")
		} else {
			ok = bw.write(bw.fixed[j%len(bw.fixed)], false, fmt.Sprint(j))
		}
		if !ok {
			return false
		}
	}
}

// readThroughSnapshot reads the watch until its SnapshotDone and 40 live
// events after it (telling the writer when SnapshotDone arrived), or until
// it breaks or 30s passed, which is r.err.
func (r *boundaryResult) readThroughSnapshot(ch <-chan spate.WatchEvent, bw *boundaryWriter) {
	deadline := time.After(30 * time.Second)
	for after := 0; after < 40; {
		select {
		case ev, ok := <-ch:
			switch {
			case !ok:
				r.err = fmt.Errorf("the watch closed during the run")
				return
			case ev.Kind == spate.WatchError:
				r.err = fmt.Errorf("the watch broke: %v", ev.Err)
				return
			}
			r.events = append(r.events, ev)
			if ev.Kind == spate.WatchSnapshotDone && r.snapDone == 0 {
				r.snapDone = bw.clock.Add(1)
				close(bw.snapped)
			}
			if r.snapDone == 0 {
				// Let the writer run while the snapshot streams in: a store
				// that sends it as the consumer reads must keep every write
				// it lets through.
				runtime.Gosched()
			} else {
				after++
			}
		case <-deadline:
			r.err = fmt.Errorf("no SnapshotDone and 40 live events within 30s")
			return
		}
	}
}

// readUntilConverged reads on until every key's last write has been
// delivered, or a while passed: what is missing then is a gap.
func (r *boundaryResult) readUntilConverged(ch <-chan spate.WatchEvent) {
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
				return
			}
			r.events = append(r.events, ev)
			if ev.Kind == spate.WatchPut {
				seen[ev.Key] = max(seen[ev.Key], ev.Revision)
			}
		case <-quiet:
			return
		}
	}
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
