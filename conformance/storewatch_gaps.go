package conformance

import (
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
)

// The two no-gaps rules (a prefix watch's and a key watch's) share their
// shape: a writer in three phases and a watcher that checks each event as
// it comes and must converge to the store's final state. This file holds
// both sides; each rule supplies its writes and its snapshot check.

// phasedWriter writes n steps in three phases: the first third before the
// watch is opened, the second while it is being set up and reading its
// snapshot, the last only once the watcher has seen SnapshotDone (so every
// event of it has to arrive live).
type phasedWriter struct {
	e         *env
	n         int
	spaced    bool          // the second phase's steps are a millisecond apart
	started   chan struct{} // closed when the first phase is written
	snapSeen  chan struct{} // closed by the watcher at SnapshotDone
	stop      chan struct{} // closed by halt
	done      chan error    // closed when the writer returns; an error first if it failed
	lastPhase int           // events the last phase wrote; read only once done is closed
	steps     atomic.Int64  // steps written so far
}

// startPhased runs write(i) for i in 1..n in its own goroutine; write
// returns how many watch events step i made. A rule defers halt, so that
// a rule that fails leaves no writer blocked (in the suite's synctest
// bubble, a goroutine left blocked when the rule ends is a deadlock).
func startPhased(e *env, n int, spaced bool, write func(i int) (events int, err error)) *phasedWriter {
	p := &phasedWriter{e: e, n: n, spaced: spaced,
		started: make(chan struct{}), snapSeen: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan error, 1)}
	go p.run(write)
	return p
}

func (p *phasedWriter) run(write func(i int) (int, error)) {
	defer close(p.done)
	for i := 1; i <= p.n; i++ {
		if !p.between(i) {
			return
		}
		events, err := write(i)
		if err != nil {
			p.done <- err
			return
		}
		if i >= 2*p.n/3 {
			p.lastPhase += events
		}
		p.steps.Store(int64(i))
	}
}

// between marks the phase boundaries before step i: false when the
// writer is to stop.
func (p *phasedWriter) between(i int) bool {
	switch i {
	case p.n / 3:
		close(p.started)
	case 2 * p.n / 3:
		select {
		case <-p.snapSeen:
		case <-p.stop:
			return false
		case <-p.e.ctx.Done():
			p.done <- p.e.ctx.Err()
			return false
		}
	}
	if p.spaced && i > p.n/3 && i < 2*p.n/3 {
		// Spaced out, so that the second phase overlaps the watch's
		// establishment, however quick.
		select {
		case <-time.After(time.Millisecond):
		case <-p.stop:
			return false
		}
	}
	return true
}

// halt stops the writer and waits for it.
func (p *phasedWriter) halt() {
	close(p.stop)
	<-p.done
}

// gapView is a no-gaps rule's watcher: the view its events build, each
// event checked as it arrives, and the store's final state it must
// converge to once the writer is done.
type gapView struct {
	e     *env
	ks    spate.Keyspace
	what  string            // "watch" or "key watch", for the messages
	exact bool              // a prefix watch: the view may hold no key the final listing lacks
	in    func(string) bool // a key the watch may deliver
	// atSnapshot checks the snapshot at SnapshotDone.
	atSnapshot func(g *gapView)

	view, last map[string]uint64
	want       map[string]uint64 // the final state, once the writer is done
	// expired: ephemeral keys the final state held whose expiry arrived
	// after it, as a delete at a later revision.
	expired  map[string]bool
	inSnap   map[string]bool // keys put before SnapshotDone
	snapDone bool
	live     int // puts and deletes after SnapshotDone
}

func newGapView(e *env, ks spate.Keyspace, what string) *gapView {
	return &gapView{e: e, ks: ks, what: what, in: func(string) bool { return true },
		view: map[string]uint64{}, last: map[string]uint64{}, expired: map[string]bool{}, inSnap: map[string]bool{}}
}

// converged: the view holds the final state (a key that expired after
// the final read may be missing).
func (g *gapView) converged() bool {
	if g.want == nil || !g.snapDone {
		return false
	}
	for k, r := range g.want {
		behind := g.view[k] < r
		if g.exact {
			behind = g.view[k] != r
		}
		if behind && !g.expired[k] {
			return false
		}
	}
	if g.exact {
		for k := range g.view {
			if _, ok := g.want[k]; !ok {
				return false // expired before the final read: its delete is still due
			}
		}
	}
	return true
}

// read applies ch's events until the view has converged to the final
// state (read by final once w is done) and at least w.lastPhase events
// have arrived live. It fails the rule at the first event that breaks the
// contract, or when eventWait passes with no event while one is due.
//
// eventWait bounds the silence between events, not the whole run: the
// writer's steps are round trips to the store (on etcd an ephemeral step
// is four or five raft proposals), and on a loaded machine 150 of them outlast
// any fixed total, although every event arrives in time. A watch with a
// gap goes silent while the view still differs, and fails as before.
func (g *gapView) read(ch <-chan spate.WatchEvent, w *phasedWriter, final func() map[string]uint64) {
	writerDone := w.done
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	steps := w.steps.Load()
	// converged() is false until the writer is done, so lastPhase is read
	// only after it.
	for !g.converged() || g.live < w.lastPhase {
		select {
		case err := <-writerDone:
			if err != nil {
				g.e.t.Fatalf("writer: %v", err)
			}
			writerDone = nil
			g.want = final()
			timer.Reset(eventWait)
		case ev, ok := <-ch:
			if !ok {
				g.e.t.Fatalf("rule: a %s ends only when its context is cancelled, its store closed or it breaks; it closed", g.what)
			}
			g.apply(ev, w)
			timer.Reset(eventWait)
			steps = w.steps.Load()
		case <-timer.C:
			switch {
			case !g.snapDone:
				g.e.t.Fatalf("rule: a %s delivers its snapshot, then SnapshotDone; %s: no SnapshotDone within %v", g.what, g.ks, eventWait)
			case g.want == nil && w.steps.Load() == steps:
				g.e.t.Fatalf("the writer made no step (at step %d of %d), and the %s delivered nothing, for %v: a store call hangs",
					steps, w.n, g.what, eventWait)
			case g.want == nil:
				g.e.t.Fatalf("rule: a %s delivers every change under its prefix; %s: no event for %v while the writer went on from step %d to %d of %d",
					g.what, g.ks, eventWait, steps, w.steps.Load(), w.n)
			case !g.converged():
				g.e.t.Fatalf("rule: a %s has no gaps, so the watcher's view converges to the store's; %s after %v it differs: %v",
					g.what, g.ks, eventWait, revisionDiff(g.view, g.want))
			default:
				g.e.t.Fatalf("rule: writes after the snapshot arrive as live events; %s: %d live events within %v, but %d writes came after SnapshotDone",
					g.ks, g.live, eventWait, w.lastPhase)
			}
		}
	}
}

func (g *gapView) apply(ev spate.WatchEvent, w *phasedWriter) {
	switch ev.Kind {
	case spate.WatchSnapshotDone:
		if g.snapDone {
			g.e.t.Fatalf("rule: a %s delivers exactly one SnapshotDone; got a second", g.what)
		}
		g.snapDone = true
		close(w.snapSeen)
		g.atSnapshot(g)
	case spate.WatchError:
		g.e.t.Fatalf("%s broke: %v", g.what, ev.Err)
	case spate.WatchPut, spate.WatchDelete:
		if !g.in(ev.Key) {
			g.e.t.Fatalf("rule: a %s never delivers an event of a key it does not watch; got %v %q", g.what, ev.Kind, ev.Key)
		}
		if ev.Revision < g.last[ev.Key] {
			g.e.t.Fatalf("rule: a key's events arrive in revision order; %s %q went %d -> %d", g.ks, ev.Key, g.last[ev.Key], ev.Revision)
		}
		g.last[ev.Key] = ev.Revision
		if g.snapDone {
			g.live++
		} else if ev.Kind == spate.WatchPut {
			g.inSnap[ev.Key] = true
		}
		if ev.Kind == spate.WatchPut {
			g.view[ev.Key] = ev.Revision
			return
		}
		delete(g.view, ev.Key)
		if r, ok := g.want[ev.Key]; ok && g.ks == spate.Ephemeral && ev.Revision > r {
			g.expired[ev.Key] = true
		}
	}
}
