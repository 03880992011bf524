package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/redistest"
	"github.com/spate-go/spate/stores/redis"
)

const eventWait = 10 * time.Second

func recv(t *testing.T, ch <-chan spate.WatchEvent, what string) spate.WatchEvent {
	t.Helper()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed while waiting for %s", what)
		}
		return ev
	case <-timer.C:
		t.Fatalf("no watch event within %v while waiting for %s", eventWait, what)
	}
	return spate.WatchEvent{}
}

// watch opens a watch and consumes its snapshot.
func watch(t *testing.T, st spate.Store, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, []spate.WatchEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := st.Watch(ctx, ks, prefix)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	var snap []spate.WatchEvent
	for {
		ev := recv(t, ch, "the snapshot")
		switch ev.Kind {
		case spate.WatchPut:
			snap = append(snap, ev)
		case spate.WatchSnapshotDone:
			return ch, snap
		default:
			t.Fatalf("snapshot: unexpected %v event: %v", ev.Kind, ev.Err)
		}
	}
}

func create(t *testing.T, st spate.Store, ks spate.Keyspace, key, value string) uint64 {
	t.Helper()
	o, err := st.Create(t.Context(), ks, key, []byte(value))
	if err != nil || !o.Won {
		t.Fatalf("create %v %q: won=%t err=%v", ks, key, o.Won, err)
	}
	return o.Revision
}

func update(t *testing.T, st spate.Store, ks spate.Keyspace, key, value string, rev uint64) uint64 {
	t.Helper()
	o, err := st.Update(t.Context(), ks, key, []byte(value), rev)
	if err != nil || !o.Won {
		t.Fatalf("update %v %q at %d: won=%t err=%v", ks, key, rev, o.Won, err)
	}
	return o.Revision
}

func open(t *testing.T, h *redistest.Harness) *redis.Store {
	t.Helper()
	st, err := h.Open(t.Context())
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return st
}

// retrying runs op until it stops failing Retryable, at most 5 times, as
// the coordinator would after a server restart (a pooled connection to the
// old process fails once).
func retrying(t *testing.T, op func() error) {
	t.Helper()
	var err error
	for range 5 {
		if err = op(); !spate.IsRetryable(err) {
			break
		}
	}
	if err != nil {
		t.Fatalf("after retries: %v", err)
	}
}

// TestCommittedWritesSurviveACrashWithAOF commits progress through the store
// on a server with appendonly yes and appendfsync always, kills the server
// (SIGKILL, no shutdown), starts it again on the same directory and checks
// that every committed value is there at its revision, and that revisions
// keep increasing.
func TestCommittedWritesSurviveACrashWithAOF(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	h := srv.NewHarness(t, testTTL)
	st := open(t, h)

	want := map[string]spate.Entry{}
	var top uint64
	for i := range 5 {
		key := fmt.Sprintf("split.%d", i)
		rev := create(t, st, spate.Durable, key, "w=0")
		for w := 1; w <= 3; w++ {
			rev = update(t, st, spate.Durable, key, "w="+strconv.Itoa(w), rev)
		}
		want[key] = spate.Entry{Key: key, Value: []byte("w=3"), Revision: rev}
		top = max(top, rev)
	}
	o, err := st.Delete(t.Context(), spate.Durable, "split.4", want["split.4"].Revision)
	if err != nil || !o.Won {
		t.Fatalf("delete: won=%t err=%v", o.Won, err)
	}
	delete(want, "split.4")
	top = max(top, o.Revision)
	ch, _ := watch(t, st, spate.Durable, "split.")

	srv.Kill()

	ev := recv(t, ch, "the watch to break")
	if ev.Kind != spate.WatchError || !errors.Is(ev.Err, spate.ErrRetryable) {
		t.Fatalf("a watch whose server died must end with a Retryable WatchError; got %v %v", ev.Kind, ev.Err)
	}
	if _, _, err := st.Get(t.Context(), spate.Durable, "split.0"); !spate.IsRetryable(err) {
		t.Fatalf("get while the server is down: want Retryable, got %v", err)
	}

	srv.StartAgain()

	check := func(name string, s spate.Store) {
		t.Helper()
		var list []spate.Entry
		retrying(t, func() (err error) { list, err = s.List(t.Context(), spate.Durable, "split."); return err })
		if len(list) != len(want) {
			t.Fatalf("%s: after the crash the listing has %d entries, want %d: %v", name, len(list), len(want), list)
		}
		for _, en := range list {
			w := want[en.Key]
			if string(en.Value) != string(w.Value) || en.Revision != w.Revision {
				t.Errorf("%s: after the crash %q reads %q@%d, committed %q@%d", name, en.Key, en.Value, en.Revision, w.Value, w.Revision)
			}
		}
	}
	check("the same store", st)
	st2 := open(t, h)
	check("a new store", st2)
	next := update(t, st2, spate.Durable, "split.0", "w=4", want["split.0"].Revision)
	if next <= top {
		t.Errorf("revisions must keep increasing across a restart: minted %d after %d", next, top)
	}
	fresh := create(t, st, spate.Durable, "split.4", "again")
	if fresh <= next {
		t.Errorf("revisions must keep increasing across a restart: minted %d after %d", fresh, next)
	}
	t.Logf("before the crash revisions reached %d; after it the store minted %d and %d", top, next, fresh)
}

// TestJobsAreIsolated: two jobs on one server share nothing.
func TestJobsAreIsolated(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := open(t, srv.NewHarness(t, testTTL))
	b := open(t, srv.NewHarness(t, testTTL))
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, snap := watch(t, b, ks, "")
		if len(snap) != 0 {
			t.Fatalf("%v: a fresh job's snapshot holds %d keys", ks, len(snap))
		}
		ra := create(t, a, ks, "shared.k", "from-a")
		create(t, a, ks, "only-a", "x")
		rb := create(t, b, ks, "shared.k", "from-b")
		if rb != 1 || ra != 1 {
			t.Errorf("%v: each job's revisions start at 1; a minted %d, b minted %d", ks, ra, rb)
		}
		ev := recv(t, ch, "b's own put")
		if ev.Kind != spate.WatchPut || ev.Key != "shared.k" || string(ev.Value) != "from-b" {
			t.Errorf("%v: b's watch saw %v %q=%q, want its own put", ks, ev.Kind, ev.Key, ev.Value)
		}
		list, err := b.List(t.Context(), ks, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || string(list[0].Value) != "from-b" {
			t.Errorf("%v: b lists %v, want only its own key", ks, list)
		}
		if o, err := a.Delete(t.Context(), ks, "shared.k", spate.AnyRevision); err != nil || !o.Won {
			t.Fatalf("delete: %v", err)
		}
		if en, ok, err := b.Get(t.Context(), ks, "shared.k"); err != nil || !ok || string(en.Value) != "from-b" {
			t.Errorf("%v: a's delete reached b: %q ok=%t err=%v", ks, en.Value, ok, err)
		}
	}
}

// TestWatchLagIsRetryable: a watcher that falls further behind than the
// change log keeps gets a Retryable error, after an unbroken run of events.
func TestWatchLagIsRetryable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := srv.NewHarness(t, testTTL, redistest.WithStoreOptions(func(o *redis.Options) {
		o.ChangeLogLength = redis.MinChangeLogLength
	}))
	st := open(t, h)
	ch, _ := watch(t, st, spate.Durable, "lag.")
	const n = 2000
	for i := range n {
		create(t, st, spate.Durable, fmt.Sprintf("lag.%04d", i), "v")
	}
	var last uint64
	for {
		ev := recv(t, ch, "events or the lag error")
		if ev.Kind == spate.WatchError {
			if !errors.Is(ev.Err, spate.ErrRetryable) {
				t.Fatalf("a lagged watcher's error must be Retryable: %v", ev.Err)
			}
			t.Logf("after %d events in order: %v", last, ev.Err)
			break
		}
		if ev.Kind != spate.WatchPut || ev.Revision != last+1 {
			t.Fatalf("events before the lag error must be unbroken: got %v@%d after %d", ev.Kind, ev.Revision, last)
		}
		last = ev.Revision
		if last == n {
			t.Fatalf("the watcher saw all %d changes; a %d-entry change log should have been trimmed past it", n, redis.MinChangeLogLength)
		}
	}
	if _, ok := <-ch; ok {
		t.Errorf("the error must be the last event")
	}
}

// TestExpiryToWatchLatency measures how late after its deadline (on the
// server's clock) an expired key's delete reaches a watcher, for the default
// sweep interval and a fast one. It fails if any expiry arrives before its
// deadline or never; the numbers are logged.
//
// It runs before the parallel tests, so the numbers are not skewed by them.
func TestExpiryToWatchLatency(t *testing.T) {
	for _, sweep := range []time.Duration{redis.DefaultSweepInterval, 50 * time.Millisecond} {
		t.Run("sweep="+sweep.String(), func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			h := srv.NewHarness(t, testTTL, redistest.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = sweep }))
			st := open(t, h)
			raw := srv.Client(t)
			ch, _ := watch(t, st, spate.Ephemeral, "lat.")
			const n = 20
			deadline := map[string]int64{}
			revs := map[string]uint64{}
			for i := range n {
				key := fmt.Sprintf("lat.%02d", i)
				revs[key] = create(t, st, spate.Ephemeral, key, "v")
				ms, err := raw.ZScore(t.Context(), "spate:{"+h.Job()+"}:e:dl", key).Result()
				if err != nil {
					t.Fatal(err)
				}
				deadline[key] = int64(ms)
				time.Sleep(23 * time.Millisecond) // spread the deadlines across sweep phases
			}
			var lat []time.Duration
			for len(lat) < n {
				ev := recv(t, ch, "an expiry")
				if ev.Kind != spate.WatchDelete {
					if ev.Kind == spate.WatchPut {
						continue
					}
					t.Fatalf("unexpected %v: %v", ev.Kind, ev.Err)
				}
				arrived := time.Now().UnixMilli()
				d := time.Duration(arrived-deadline[ev.Key]) * time.Millisecond
				if d < 0 {
					t.Errorf("rule: a key expires no earlier than its deadline; %q's delete arrived %v early", ev.Key, -d)
				}
				if ev.Revision <= revs[ev.Key] {
					t.Errorf("expiry of %q at revision %d, not above its put at %d", ev.Key, ev.Revision, revs[ev.Key])
				}
				lat = append(lat, d)
			}
			slices.Sort(lat)
			var sum time.Duration
			for _, d := range lat {
				sum += d
			}
			t.Logf("expiry-to-watch latency over %d keys, TTL %v, SweepInterval %v (documented bound %v): min %v, median %v, mean %v, max %v",
				n, testTTL, sweep, st.Capabilities().ExpiryLatency, lat[0], lat[n/2], sum/n, lat[n-1])
		})
	}
}

// TestLinearizableAcrossClientsWithSweep checks a history of concurrent
// compare-and-swap increments, creates and deletes by many clients, on both
// keyspaces, while every client's expiry sweep runs every 10ms and other
// ephemeral keys keep expiring.
func TestLinearizableAcrossClientsWithSweep(t *testing.T) {
	t.Parallel()
	const (
		clients   = 8
		rounds    = 120
		maxRounds = 20_000
		ttl       = 2 * time.Second
	)
	srv := redistest.Start(t)
	h := srv.NewHarness(t, ttl, redistest.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = 10 * time.Millisecond }))
	ctx := t.Context()
	stores := make([]*redis.Store, clients+1)
	for i := range stores {
		stores[i] = open(t, h)
	}
	rec := &conformance.History{}
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		if o, err := conformance.RecordCreate(ctx, rec, 0, stores[0], ks, "ctr", []byte("0")); err != nil || !o.Won {
			t.Fatalf("create counter: %v", err)
		}
	}

	// Keys that are never renewed, so the sweeps expire them throughout.
	churner := stores[clients]
	expired := make(chan struct{})
	churnCh, _ := watch(t, churner, spate.Ephemeral, "churn.")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		once := sync.Once{}
		for {
			select {
			case ev := <-churnCh:
				if ev.Kind == spate.WatchDelete {
					once.Do(func() { close(expired) })
				}
			case <-stop:
				return
			}
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = churner.Create(ctx, spate.Ephemeral, "churn."+strconv.Itoa(i), []byte("x"))
		}
	})

	won := [3]int{}
	var mu sync.Mutex
	errs := make(chan error, clients)
	var workers sync.WaitGroup
	for c := range clients {
		workers.Go(func() {
			s := stores[c]
			// At least rounds rounds, and on until some churn key has
			// expired, so that the history overlaps the sweeps' deletes.
			for r := 0; r < rounds || !closed(expired); r++ {
				if r == maxRounds {
					errs <- fmt.Errorf("client %d: no churn key expired within %d rounds", c, r)
					return
				}
				ks := []spate.Keyspace{spate.Durable, spate.Ephemeral}[r%2]
				if r%5 == 4 {
					// create-if-absent / guarded delete of a flag
					if o, err := conformance.RecordCreate(ctx, rec, c, s, spate.Durable, "flag", []byte("c"+strconv.Itoa(c))); err == nil && o.Won {
						_, _ = conformance.RecordDelete(ctx, rec, c, s, spate.Durable, "flag", o.Revision)
					} else if err == nil {
						_, _ = conformance.RecordDelete(ctx, rec, c, s, spate.Durable, "flag", spate.AnyRevision)
					}
					continue
				}
				en, ok, err := conformance.RecordGet(ctx, rec, c, s, ks, "ctr")
				if err != nil || !ok {
					errs <- fmt.Errorf("client %d get %v: ok=%t err=%v", c, ks, ok, err)
					return
				}
				v, _ := strconv.Atoi(string(en.Value))
				o, err := conformance.RecordUpdate(ctx, rec, c, s, ks, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
				if err != nil {
					errs <- fmt.Errorf("client %d update %v: %v", c, ks, err)
					return
				}
				if o.Won {
					mu.Lock()
					won[ks]++
					mu.Unlock()
				}
			}
		})
	}
	workers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		en, ok, err := conformance.RecordGet(ctx, rec, 0, stores[0], ks, "ctr")
		if err != nil || !ok {
			t.Fatalf("final get %v: ok=%t err=%v", ks, ok, err)
		}
		if got, _ := strconv.Atoi(string(en.Value)); got != won[ks] {
			t.Errorf("rule: concurrent CAS increments lose no update; %v counter reads %d after %d won increments", ks, got, won[ks])
		}
	}
	close(stop)
	wg.Wait()
	ok, info := rec.Check(60 * time.Second)
	if !ok {
		t.Fatalf("rule: create, update and delete are linearizable; porcupine: %s", info)
	}
	t.Logf("%d operations by %d clients linearizable (%s); durable wins %d, ephemeral wins %d",
		rec.Len(), clients, info, won[spate.Durable], won[spate.Ephemeral])
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestLostReplyIsRetryableNeverLost: when a mutation's reply is lost after
// the server ran its script, the store reports a Retryable error ("may have
// landed"), never a Lost outcome. go-redis retries a command whose
// connection broke; running a create or CAS script a second time would see
// the first run's write and report Lost for a write that won. The control
// at the end shows that hazard with a plain go-redis Script.Run.
func TestLostReplyIsRetryableNeverLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	h := srv.NewHarness(t, testTTL,
		redistest.WithClientOptions(func(o *goredis.Options) { o.Addr = proxy.Addr() }), // go-redis defaults: MaxRetries 3
		redistest.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = time.Hour }))
	st := open(t, h)
	ctx := t.Context()

	// Warm the server's script cache, so that the EVALSHA whose reply is
	// lost is one that runs (a NOSCRIPT reply would mean it did not).
	warm := create(t, st, spate.Durable, "warm", "v")
	warm = update(t, st, spate.Durable, "warm", "v", warm)
	if o, err := st.Delete(ctx, spate.Durable, "warm", warm); err != nil || !o.Won {
		t.Fatalf("warm-up delete: %v", err)
	}

	lose := func(op string, call func() (spate.Outcome, error)) {
		t.Helper()
		proxy.DropReplyTo("evalsha")
		o, err := call()
		if proxy.Armed() {
			t.Fatalf("%s: the proxy never saw the script", op)
		}
		if !spate.IsRetryable(err) {
			t.Fatalf("%s whose reply was lost: want a Retryable error, got outcome %+v, err %v", op, o, err)
		}
	}
	lose("create", func() (spate.Outcome, error) { return st.Create(ctx, spate.Durable, "lost.k", []byte("v1")) })
	en, ok, err := st.Get(ctx, spate.Durable, "lost.k")
	if err != nil || !ok || string(en.Value) != "v1" {
		t.Fatalf("the create landed: get %q ok=%t err=%v", en.Value, ok, err)
	}
	lose("update", func() (spate.Outcome, error) {
		return st.Update(ctx, spate.Durable, "lost.k", []byte("v2"), en.Revision)
	})
	en2, ok, err := st.Get(ctx, spate.Durable, "lost.k")
	if err != nil || !ok || string(en2.Value) != "v2" || en2.Revision <= en.Revision {
		t.Fatalf("the update landed: get %q@%d ok=%t err=%v", en2.Value, en2.Revision, ok, err)
	}
	lose("guarded delete", func() (spate.Outcome, error) { return st.Delete(ctx, spate.Durable, "lost.k", en2.Revision) })
	if _, ok, err := st.Get(ctx, spate.Durable, "lost.k"); err != nil || ok {
		t.Fatalf("the delete landed: present=%t err=%v", ok, err)
	}

	// Control: go-redis's own Script.Run retries after the lost reply, the
	// script runs twice, and the caller is told the create lost.
	raw := goredis.NewClient(&goredis.Options{Addr: proxy.Addr()})
	defer raw.Close()
	createIfAbsent := goredis.NewScript(`if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end redis.call('SET', KEYS[1], ARGV[1]) return 1`)
	if err := createIfAbsent.Load(ctx, raw).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("evalsha")
	won, err := createIfAbsent.Run(ctx, raw, []string{"control"}, "v").Int()
	if err != nil || won != 0 {
		t.Fatalf("control: expected go-redis to retry the script and report 0 (lost) for a create that won; got %d, %v", won, err)
	}
	t.Log("control: a retried create-if-absent script reported lost for its own write; the driver runs scripts once")
}

// TestMassExpiryReachesWatchers: more keys expire at once than one sweep
// script handles, and nobody reads them; the sweeps still turn every one
// into exactly one delete for watchers, and the keyspace ends empty.
func TestMassExpiryReachesWatchers(t *testing.T) {
	t.Parallel()
	const n = 1300 // over two sweep batches
	srv := redistest.Start(t)
	// The first sweep comes after every key is due, so it must loop over
	// several batches.
	h := srv.NewHarness(t, testTTL, redistest.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = 2 * testTTL }))
	st := open(t, h)
	ch, _ := watch(t, st, spate.Ephemeral, "mass.")
	put := map[string]uint64{}
	start := time.Now()
	for i := range n {
		key := fmt.Sprintf("mass.%04d", i)
		put[key] = create(t, st, spate.Ephemeral, key, "v")
	}
	if took := time.Since(start); took > testTTL {
		t.Logf("creating %d keys took %v, longer than the TTL: the first sweep sees fewer than all of them due", n, took)
	}
	deleted := map[string]bool{}
	for len(deleted) < n {
		ev := recv(t, ch, fmt.Sprintf("expiry %d of %d", len(deleted)+1, n))
		switch ev.Kind {
		case spate.WatchPut:
		case spate.WatchDelete:
			if deleted[ev.Key] {
				t.Fatalf("%q expired twice", ev.Key)
			}
			if ev.Revision <= put[ev.Key] {
				t.Errorf("%q expired at revision %d, not above its put at %d", ev.Key, ev.Revision, put[ev.Key])
			}
			deleted[ev.Key] = true
		default:
			t.Fatalf("unexpected %v: %v", ev.Kind, ev.Err)
		}
	}
	list, err := st.List(t.Context(), spate.Ephemeral, "")
	if err != nil || len(list) != 0 {
		t.Errorf("after every key expired the keyspace lists %d keys (err %v)", len(list), err)
	}
}

// TestCancelledWatchEnds: cancelling a watch's context closes its channel
// without an error event, while other watches of the store go on.
func TestCancelledWatchEnds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st := open(t, srv.NewHarness(t, testTTL))
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := st.Watch(ctx, spate.Durable, "")
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, ch, "SnapshotDone"); ev.Kind != spate.WatchSnapshotDone {
		t.Fatalf("got %v", ev.Kind)
	}
	other, _ := watch(t, st, spate.Durable, "")
	cancel()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for alive := true; alive; {
		select {
		case ev, ok := <-ch:
			if ok && ev.Kind == spate.WatchError {
				t.Errorf("a cancelled watch ends without an error event; got %v", ev.Err)
			}
			alive = ok
		case <-timer.C:
			t.Fatalf("a cancelled watch's channel is still open after %v", eventWait)
		}
	}
	create(t, st, spate.Durable, "after", "v")
	if ev := recv(t, other, "the put"); ev.Kind != spate.WatchPut || ev.Key != "after" {
		t.Errorf("the other watch saw %v %q", ev.Kind, ev.Key)
	}
}
