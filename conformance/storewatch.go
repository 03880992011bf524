package conformance

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// The rules of watches: the snapshot, the live stream, and how it ends.

func mustWatch(e *env, s spate.Store, ks spate.Keyspace, prefix string) <-chan spate.WatchEvent {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	ch, err := boundedWatch(e, s, ctx, ks, prefix)
	if err != nil {
		e.t.Fatalf("watch %s %q: unexpected error: %v", ks, prefix, err)
	}
	return ch
}

// readSnapshot collects the snapshot puts up to SnapshotDone.
func readSnapshot(e *env, ch <-chan spate.WatchEvent) []spate.WatchEvent {
	e.t.Helper()
	var puts []spate.WatchEvent
	for {
		ev := recvTimeout(e.t, ch, eventWait, "its snapshot, then SnapshotDone")
		switch ev.Kind {
		case spate.WatchPut:
			puts = append(puts, ev)
		case spate.WatchSnapshotDone:
			return puts
		case spate.WatchError:
			e.t.Fatalf("watch broke during the snapshot: %v", ev.Err)
		default:
			e.t.Fatalf("rule: a snapshot holds only puts, then SnapshotDone; got %v %q", ev.Kind, ev.Key)
		}
	}
}

// expectEvent receives events until one for key arrives and returns it;
// events for other keys are returned in skipped.
func expectEvent(e *env, ch <-chan spate.WatchEvent, key string, wait time.Duration) spate.WatchEvent {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			e.t.Fatalf("rule: a watch delivers every change under its prefix; no event for %q within %v", key, wait)
		}
		ev := recvTimeout(e.t, ch, left, fmt.Sprintf("every change under its prefix (an event for %q)", key))
		if ev.Kind == spate.WatchError {
			e.t.Fatalf("watch broke while waiting for %q: %v", key, ev.Err)
		}
		if ev.Kind == spate.WatchSnapshotDone {
			e.t.Fatalf("rule: a watch delivers exactly one SnapshotDone; got a second one while waiting for %q", key)
		}
		if ev.Key == key {
			return ev
		}
	}
}

func testWatchSnapshot(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		want := map[string]uint64{}
		for _, k := range []string{"snap.a", "snap.b", "snap.c"} {
			want[k] = mustCreate(e, s, ks, k, "v-"+k)
		}
		if o := mustDelete(e, s, ks, "snap.b", want["snap.b"]); !o.Won {
			e.t.Fatalf("delete lost")
		}
		delete(want, "snap.b")
		ch := mustWatch(e, s, ks, "snap.")
		puts := readSnapshot(e, ch)
		got := map[string]uint64{}
		for _, p := range puts {
			got[p.Key] = p.Revision
			if string(p.Value) != "v-"+p.Key {
				e.t.Errorf("rule: snapshot puts carry the key's value; %q has %q", p.Key, p.Value)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			e.t.Errorf("rule: the snapshot holds exactly the live keys at their revisions; %s snapshot %v, want %v", ks, got, want)
		}
		// Live events follow, and no second SnapshotDone.
		r := mustCreate(e, s, ks, "snap.d", "v")
		ev := expectEvent(e, ch, "snap.d", eventWait)
		if ev.Kind != spate.WatchPut || ev.Revision != r {
			e.t.Errorf("rule: live puts follow the snapshot; got %v@%d, want put@%d", ev.Kind, ev.Revision, r)
		}
		e.t.Logf("%s: %d snapshot puts, SnapshotDone, 1 live event", ks, len(puts))
	}
}

// testWatchPrefix: a watch of "pf.in." holds, in its snapshot and live,
// the keys under that prefix and no other (not "pf.inx", which shares its
// bytes but not its trailing dot); the rule requires the in-prefix key on
// each side of the snapshot boundary, so it never passes on an empty watch.
func testWatchPrefix(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		mustCreate(e, s, ks, "pf.in.a", "v")
		mustCreate(e, s, ks, "pf.out.a", "v")
		mustCreate(e, s, ks, "pf.inx", "v") // shares a byte prefix only
		ch := mustWatch(e, s, ks, "pf.in.")
		var snap []string
		for _, p := range readSnapshot(e, ch) {
			snap = append(snap, p.Key)
		}
		for _, k := range snap {
			assert.True(e.t, strings.HasPrefix(k, "pf.in."), "rule: a watch delivers only keys under its prefix; %s snapshot of %q holds %q", ks, "pf.in.", k)
		}
		require.Contains(e.t, snap, "pf.in.a", "rule: a watch's snapshot holds every live key under its prefix; %s snapshot of %q", ks, "pf.in.")
		mustCreate(e, s, ks, "pf.out.b", "v")
		mustCreate(e, s, ks, "pf.in.b", "v")
		ev := recvTimeout(e.t, ch, eventWait, "live events after its snapshot")
		assert.Equal(e.t, "pf.in.b", ev.Key, "rule: a watch delivers only keys under its prefix; %s live event for %q on prefix %q", ks, ev.Key, "pf.in.")
		e.t.Logf("%s: %d snapshot puts, 1 live event under %q", ks, len(snap), "pf.in.")
	}
}

func testWatchDeletes(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "wd.")
		readSnapshot(e, ch)
		r := mustCreate(e, s, ks, "wd.k", "v")
		expectEvent(e, ch, "wd.k", eventWait)
		if o := mustDelete(e, s, ks, "wd.k", r); !o.Won {
			e.t.Fatalf("delete lost")
		}
		ev := expectEvent(e, ch, "wd.k", eventWait)
		if ev.Kind != spate.WatchDelete {
			e.t.Fatalf("rule: an explicit delete reaches watchers as a delete; got %v", ev.Kind)
		}
		if ev.Revision <= r {
			e.t.Errorf("rule: a delete event's revision exceeds the key's last put; %d <= %d", ev.Revision, r)
		}
		e.t.Logf("%s: 2 live events (put, delete)", ks)
	}
}

// testWatchNoGaps writes in three phases around a watch: a third before it
// is opened (the snapshot must hold every key of it still live), a third
// while it is being established (either side of the snapshot boundary), and
// a third only after the watcher has seen SnapshotDone (these must arrive
// live). The watcher's view must converge to a final listing, every key's
// events must come in revision order (intermediate revisions of one key
// superseded before delivery may be coalesced; the latest never is), and
// the rule proves it exercised both sides of the boundary: it fails if the
// snapshot held fewer keys than the first phase left live, or if fewer live
// events arrived than the last phase wrote.
func testWatchNoGaps(e *env) {
	s := e.open()
	writer := e.open()
	const n = 150
	for _, ks := range keyspaces {
		rev := mustCreate(e, writer, ks, "gap.counter", "0")
		sent := make([]time.Time, n+1) // when the writer sent each key's create
		w := startPhased(e, n, false, func(i int) (int, error) {
			o, err := writer.Update(e.ctx, ks, "gap.counter", []byte(strconv.Itoa(i)), rev)
			if err == nil && !o.Won && ks == spate.Ephemeral {
				// The counter expired while the writer waited for
				// SnapshotDone (a snapshot read for longer than the TTL):
				// it is created again, as a create-if-absent.
				o, err = writer.Create(e.ctx, ks, "gap.counter", []byte(strconv.Itoa(i)))
			}
			if err != nil || !o.Won {
				return 0, fmt.Errorf("update %d: won=%t err=%v", i, o.Won, err)
			}
			rev = o.Revision
			k := fmt.Sprintf("gap.k%03d", i)
			sent[i] = time.Now()
			c, err := writer.Create(e.ctx, ks, k, []byte("v"))
			if err != nil {
				return 0, err
			}
			if i%10 != 0 {
				return 2, nil
			}
			_, err = writer.Delete(e.ctx, ks, k, c.Revision)
			return 3, err
		})
		defer w.halt()
		<-w.started
		ch := mustWatch(e, s, ks, "gap.")
		opened := time.Now()
		// Every key the first phase left live (creates 1 .. n/3-1, less
		// the deleted ones) and the counter were live when the watch began;
		// on the ephemeral keyspace, only those written less than a TTL
		// before the watch was opened (an ephemeral key lives at least one
		// TTL after its write, and may be gone after that: on a loaded
		// machine with a short TTL the first phase can outlast it).
		ttl := s.Capabilities().TTL
		before := []string{"gap.counter"}
		for i := 1; i < n/3; i++ {
			if i%10 != 0 && (ks == spate.Durable || opened.Sub(sent[i]) < ttl) {
				before = append(before, fmt.Sprintf("gap.k%03d", i))
			}
		}
		g := newGapView(e, ks, "watch")
		g.exact = true
		g.atSnapshot = func(g *gapView) {
			// The snapshot holds every key live from the Watch call until
			// SnapshotDone: a store may read it over that time (a NATS
			// consumer delivers it message by message), so an ephemeral
			// key whose TTL ran out meanwhile may be folded away as
			// expired. Those must be live at SnapshotDone too.
			done := time.Now()
			for _, k := range before {
				if ks == spate.Ephemeral && k != "gap.counter" {
					i, _ := strconv.Atoi(strings.TrimPrefix(k, "gap.k"))
					if done.Sub(sent[i]) >= ttl {
						continue
					}
				}
				if !g.inSnap[k] {
					e.t.Fatalf("rule: a watch has no gaps across the snapshot boundary; %s: %q was live when the watch began but is not in the snapshot (%d puts)",
						ks, k, len(g.inSnap))
				}
			}
		}
		g.read(ch, w, func() map[string]uint64 {
			final, err := s.List(e.ctx, ks, "gap.")
			if err != nil {
				e.t.Fatalf("list: %v", err)
			}
			want := map[string]uint64{}
			for _, en := range final {
				want[en.Key] = en.Revision
			}
			return want
		})
		e.t.Logf("%s: %d keys in the snapshot (%d live before the watch), %d live events (%d written after SnapshotDone)",
			ks, len(g.inSnap), len(before), g.live, w.lastPhase)
	}
	// Writes landing while the watch is being set up (a live stream
	// subscribed after the snapshot read loses them).
	boundaryCheck(e, writer, "gapb.", func([]string) <-chan spate.WatchEvent { return mustWatch(e, s, spate.Durable, "gapb.") }, true, false)
}

// testCancelledWatch: a live watch (its snapshot read, a live event seen)
// ends when its context is cancelled: its channel closes within eventWait,
// and whatever it still delivers before closing is no event of a write
// made after the cancellation.
func testCancelledWatch(e *env) {
	s := e.open()
	writer := e.open()
	for _, ks := range keyspaces {
		ctx, cancel := context.WithCancel(e.ctx)
		ch, err := boundedWatch(e, s, ctx, ks, "cw.")
		if err != nil {
			cancel()
			e.t.Fatalf("watch: %v", err)
		}
		readSnapshot(e, ch)
		mustCreate(e, writer, ks, "cw.before", "v")
		if ev := expectEvent(e, ch, "cw.before", eventWait); ev.Kind != spate.WatchPut {
			cancel()
			e.t.Fatalf("rule: a create reaches a live watch as a put; got %v", ev.Kind)
		}
		cancel()
		mustCreate(e, writer, ks, "cw.after", "v")
		timer := time.NewTimer(eventWait)
		late := 0
	drain:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break drain
				}
				if ev.Key == "cw.after" {
					// Tolerated only while the stream winds down; it must
					// still close.
					late++
					continue
				}
			case <-timer.C:
				e.t.Fatalf("rule: cancelling a watch's context ends the stream and closes its channel; %s: still open %v after the cancellation", ks, eventWait)
			}
		}
		timer.Stop()
		e.t.Logf("%s: 1 live event before the cancellation, %d after it, then the channel closed", ks, late)
	}
}

// testWatchPut: a live put carries the key, the revision the write minted
// and the value written, for a create and for an update.
func testWatchPut(e *env) {
	s := e.open()
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "wp.")
		readSnapshot(e, ch)
		r := mustCreate(e, s, ks, "wp.k", "created")
		ev := expectEvent(e, ch, "wp.k", eventWait)
		require.Equal(e.t, spate.WatchPut, ev.Kind, "rule: a create reaches watchers as a put")
		assert.Equal(e.t, r, ev.Revision, "rule: a put event carries the revision its write minted; %s create", ks)
		assert.Equal(e.t, "created", string(ev.Value), "rule: a put event carries the value written; %s create", ks)
		o := mustUpdate(e, s, ks, "wp.k", "updated", r)
		require.True(e.t, o.Won, "update at the current revision lost")
		ev = expectEvent(e, ch, "wp.k", eventWait)
		require.Equal(e.t, spate.WatchPut, ev.Kind, "rule: an update reaches watchers as a put")
		assert.Equal(e.t, o.Revision, ev.Revision, "rule: a put event carries the revision its write minted; %s update", ks)
		assert.Equal(e.t, "updated", string(ev.Value), "rule: a put event carries the value written; %s update", ks)
		e.t.Logf("%s: 2 live puts", ks)
	}
}

// testWatchLatest: a watcher that does not read while one key is updated
// 100 times and 40 others are created (every fourth deleted again) must,
// once it reads, reach each key's latest revision: it may coalesce the
// revisions it fell behind on, never drop the last. Every put it delivers
// carries a revision a write minted.
func testWatchLatest(e *env) {
	s := e.open()
	writer := e.open()
	ks := spate.Durable // an ephemeral key could expire while the watcher catches up
	ch := mustWatch(e, s, ks, "lr.")
	readSnapshot(e, ch)
	minted := map[uint64]bool{}
	rev := mustCreate(e, writer, ks, "lr.hot", "0")
	minted[rev] = true
	for i := 1; i <= 100; i++ {
		o := mustUpdate(e, writer, ks, "lr.hot", strconv.Itoa(i), rev)
		require.True(e.t, o.Won, "update %d at the current revision lost", i)
		rev = o.Revision
		minted[rev] = true
	}
	for j := range 40 {
		k := fmt.Sprintf("lr.k%02d", j)
		r := mustCreate(e, writer, ks, k, "v")
		minted[r] = true
		if j%4 == 0 {
			require.True(e.t, mustDelete(e, writer, ks, k, r).Won, "guarded delete at the current revision lost")
		}
	}
	writes := len(minted) + 10
	final := listMap(e, writer, ks, "lr.")
	view := map[string]uint64{}
	live := 0
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for !sameRevisions(view, final) {
		select {
		case ev, ok := <-ch:
			require.True(e.t, ok, "rule: a watch ends only when its context is cancelled, its store closed or it breaks; it closed")
			switch ev.Kind {
			case spate.WatchError:
				e.t.Fatalf("watch broke: %v", ev.Err)
			case spate.WatchSnapshotDone:
				e.t.Fatalf("rule: a watch delivers exactly one SnapshotDone; got a second")
			case spate.WatchPut:
				require.True(e.t, minted[ev.Revision], "rule: a watch delivers revisions writes minted; put %q@%d was never written", ev.Key, ev.Revision)
				view[ev.Key] = ev.Revision
			case spate.WatchDelete:
				delete(view, ev.Key)
			}
			live++
		case <-timer.C:
			e.t.Fatalf("rule: the latest revision of every key is always delivered; after %v the watcher still misses %v",
				eventWait, revisionDiff(view, final))
		}
	}
	e.t.Logf("%d writes while the watcher did not read; it caught up with %d live events", writes, live)
}

// testWatchOrder: three keys, each created and then updated 60 times by
// another client while the watcher reads: every key's events arrive in
// revision order, and the watcher sees each key's last revision.
func testWatchOrder(e *env) {
	s := e.open()
	writer := e.open()
	keys := []string{"wo.a", "wo.b", "wo.c"}
	for _, ks := range keyspaces {
		ch := mustWatch(e, s, ks, "wo.")
		readSnapshot(e, ch)
		done := make(chan map[string]uint64, 1)
		errc := make(chan error, 1)
		go func() {
			revs := map[string]uint64{}
			for _, k := range keys {
				o, err := writer.Create(e.ctx, ks, k, []byte("0"))
				if err != nil || !o.Won {
					errc <- fmt.Errorf("create %q: won=%t err=%v", k, o.Won, err)
					return
				}
				revs[k] = o.Revision
			}
			for i := 1; i <= 60; i++ {
				for _, k := range keys {
					o, err := writer.Update(e.ctx, ks, k, []byte(strconv.Itoa(i)), revs[k])
					if err != nil || !o.Won {
						errc <- fmt.Errorf("update %q: won=%t err=%v", k, o.Won, err)
						return
					}
					revs[k] = o.Revision
				}
			}
			done <- revs
		}()
		last := map[string]uint64{}
		events := map[string]int{}
		var final map[string]uint64
		timer := time.NewTimer(eventWait)
		caughtUp := func() bool {
			if final == nil {
				return false
			}
			for k, r := range final {
				if last[k] != r {
					return false
				}
			}
			return true
		}
		for !caughtUp() {
			select {
			case revs := <-done:
				final = revs
				timer.Reset(eventWait)
			case err := <-errc:
				e.t.Fatalf("writer: %v", err)
			case ev, ok := <-ch:
				require.True(e.t, ok, "rule: a watch ends only when its context is cancelled, its store closed or it breaks; it closed")
				require.NotEqual(e.t, spate.WatchError, ev.Kind, "watch broke: %v", ev.Err)
				require.Equal(e.t, spate.WatchPut, ev.Kind, "only puts were written; got %v %q", ev.Kind, ev.Key)
				require.GreaterOrEqual(e.t, ev.Revision, last[ev.Key], "rule: a key's events arrive in revision order; %s %q went %d -> %d",
					ks, ev.Key, last[ev.Key], ev.Revision)
				last[ev.Key] = ev.Revision
				events[ev.Key]++
				timer.Reset(eventWait) // a slow writer is not a stuck watcher
			case <-timer.C:
				e.t.Fatalf("the watcher did not reach the writer's last revisions %v within %v of its last event; it saw %v", final, eventWait, last)
			}
		}
		timer.Stop()
		most := 0
		for _, n := range events {
			most = max(most, n)
		}
		require.GreaterOrEqual(e.t, most, 2, "the watcher saw no key change twice (events %v): the rule checked no order", events)
		e.t.Logf("%s: live events per key %v for 61 writes each", ks, events)
	}
	// Writes landing while the watch is being set up (a live stream that
	// starts before the snapshot replays older revisions after it).
	boundaryCheck(e, writer, "wob.", func([]string) <-chan spate.WatchEvent { return mustWatch(e, s, spate.Durable, "wob.") }, false, true)
}

// lagWrites is how many changes the lagging-watcher rule makes while its
// watcher does not read: more than the 4096 events the in-tree drivers
// hold for a slow watcher, so that on them the rule sees the stream break.
const lagWrites = 5000

// testLaggingWatcher: a watcher that reads nothing while 5000 changes are
// made under its prefix (by 8 writers on 10 keys each: creates, updates,
// a delete every 50th change), and then reads, gets one of two things,
// never a silent gap: either the stream converges to the store's state,
// or it breaks with a Retryable WatchError as its last event and its
// channel closes, after which a re-watch's snapshot matches a listing.
func testLaggingWatcher(e *env) {
	s := e.open()
	const writers, keysEach = 8, 10
	stores := make([]spate.Store, writers)
	for i := range stores {
		stores[i] = e.open()
	}
	ch := mustWatch(e, s, spate.Durable, "lag.")
	readSnapshot(e, ch)
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			st := stores[w]
			revs := make([]uint64, keysEach)
			for i := range lagWrites / writers {
				k := i % keysEach
				key := fmt.Sprintf("lag.%d.%d", w, k)
				var (
					o   spate.Outcome
					err error
				)
				switch {
				case revs[k] == 0:
					o, err = st.Create(e.ctx, spate.Durable, key, []byte(strconv.Itoa(i)))
				case i%50 == 49:
					o, err = st.Delete(e.ctx, spate.Durable, key, revs[k])
					o.Revision = 0
				default:
					o, err = st.Update(e.ctx, spate.Durable, key, []byte(strconv.Itoa(i)), revs[k])
				}
				if err != nil || !o.Won {
					errc <- fmt.Errorf("writer %d change %d of %q: won=%t err=%v", w, i, key, o.Won, err)
					return
				}
				revs[k] = o.Revision
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		e.t.Fatalf("%v", err)
	}
	// Let the driver take in what it will before the watcher reads.
	time.Sleep(time.Second)
	final := listMap(e, s, spate.Durable, "lag.")
	view := map[string]uint64{}
	last := map[string]uint64{}
	live := 0
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for !sameRevisions(view, final) {
		select {
		case ev, ok := <-ch:
			require.True(e.t, ok, "rule: a broken stream delivers a WatchError as its last event; the lagging watcher's channel closed after %d live events without one, its view short of the store's by %v",
				live, revisionDiff(view, final))
			switch ev.Kind {
			case spate.WatchSnapshotDone:
				e.t.Fatalf("rule: a watch delivers exactly one SnapshotDone; the lagging watcher got a second")
			case spate.WatchError:
				require.Error(e.t, ev.Err, "rule: a WatchError says why the stream broke; Err is nil")
				require.ErrorIs(e.t, ev.Err, spate.ErrRetryable, "rule: a watcher too slow to keep up breaks Retryable; got %v", ev.Err)
				require.NotErrorIs(e.t, ev.Err, spate.ErrFatal, "rule: a watcher too slow to keep up breaks Retryable, not Fatal; got %v", ev.Err)
				select {
				case after, ok := <-ch:
					require.False(e.t, ok, "rule: a WatchError is the last event; %v %q came after it", after.Kind, after.Key)
				case <-timer.C:
					e.t.Fatalf("rule: a broken stream's channel closes; still open %v after its WatchError", eventWait)
				}
				rewatch := mustWatch(e, s, spate.Durable, "lag.")
				snap := map[string]uint64{}
				for _, p := range readSnapshot(e, rewatch) {
					snap[p.Key] = p.Revision
				}
				require.Equal(e.t, final, snap, "rule: after a Retryable break the consumer re-watches; the new snapshot differs from the store")
				e.t.Logf("%d changes while the watcher did not read: it broke Retryable after %d live events (%v); the re-watch matched the store",
					lagWrites, live, ev.Err)
				return
			case spate.WatchPut, spate.WatchDelete:
				require.GreaterOrEqual(e.t, ev.Revision, last[ev.Key], "rule: a key's events arrive in revision order; %q went %d -> %d",
					ev.Key, last[ev.Key], ev.Revision)
				last[ev.Key] = ev.Revision
				live++
				if ev.Kind == spate.WatchPut {
					view[ev.Key] = ev.Revision
				} else {
					delete(view, ev.Key)
				}
			}
		case <-timer.C:
			e.t.Fatalf("rule: a lagging watcher never has a silent gap (it converges or breaks with a WatchError); %v after it began reading, %d live events in, it still misses %v and has not broken",
				eventWait, live, revisionDiff(view, final))
		}
	}
	e.t.Logf("%d changes while the watcher did not read: it converged to the store with %d live events", lagWrites, live)
}

// testWatchSetupErrors: a watch that cannot be established returns its
// error directly and no channel: a cancelled context (Retryable), an
// invalid prefix, an invalid keyspace, a closed store (Fatal).
func testWatchSetupErrors(e *env) {
	s := e.open()
	closed := e.open()
	require.NoError(e.t, closed.Close(), "close")
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	for _, c := range []struct {
		what  string
		store spate.Store
		ctx   context.Context
		ks    spate.Keyspace
		pre   string
		class error
	}{
		{"a cancelled context", s, cancelled, spate.Durable, "ws.", spate.ErrRetryable},
		{"an invalid prefix", s, e.ctx, spate.Durable, "ws..", spate.ErrInvalidKey},
		{"an invalid keyspace", s, e.ctx, spate.Keyspace(3), "ws.", spate.ErrFatal},
		{"a closed store", closed, e.ctx, spate.Ephemeral, "ws.", spate.ErrClosed},
	} {
		ch, err := boundedWatch(e, c.store, c.ctx, c.ks, c.pre)
		require.Error(e.t, err, "rule: an error establishing a watch is returned directly; Watch with %s returned a channel and no error", c.what)
		require.ErrorIs(e.t, err, c.class, "Watch with %s", c.what)
		require.Nil(e.t, ch, "rule: an error establishing a watch is returned directly; Watch with %s returned a channel too", c.what)
	}
}

// listMap lists prefix and returns each key's revision.
func listMap(e *env, s spate.Store, ks spate.Keyspace, prefix string) map[string]uint64 {
	e.t.Helper()
	list, err := s.List(e.ctx, ks, prefix)
	require.NoError(e.t, err, "list %s %q", ks, prefix)
	m := make(map[string]uint64, len(list))
	for _, en := range list {
		m[en.Key] = en.Revision
	}
	return m
}

func sameRevisions(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, r := range b {
		if a[k] != r {
			return false
		}
	}
	return true
}

// revisionDiff describes how view differs from want, briefly.
func revisionDiff(view, want map[string]uint64) []string {
	var diff []string
	for k, r := range want {
		if view[k] != r {
			diff = append(diff, fmt.Sprintf("%s@%d (saw %d)", k, r, view[k]))
		}
	}
	for k := range view {
		if _, ok := want[k]; !ok {
			diff = append(diff, k+" (deleted, delete never seen)")
		}
	}
	slices.Sort(diff)
	return diff[:min(len(diff), 8)]
}
