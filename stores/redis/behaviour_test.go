package redis_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

const eventWait = 10 * time.Second

func recv(t *testing.T, ch <-chan spate.WatchEvent, what string) spate.WatchEvent {
	t.Helper()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "watch closed while waiting for %s", what)
		return ev
	case <-timer.C:
		require.FailNow(t, fmt.Sprintf("no watch event within %v while waiting for %s", eventWait, what))
	}
	return spate.WatchEvent{}
}

// watch opens a watch and consumes its snapshot.
func watch(t *testing.T, st spate.Store, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, []spate.WatchEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := st.Watch(ctx, ks, prefix)
	require.NoError(t, err, "watch")
	var snap []spate.WatchEvent
	for {
		ev := recv(t, ch, "the snapshot")
		switch ev.Kind {
		case spate.WatchPut:
			snap = append(snap, ev)
		case spate.WatchSnapshotDone:
			return ch, snap
		default:
			require.FailNow(t, fmt.Sprintf("snapshot: unexpected %v event: %v", ev.Kind, ev.Err))
		}
	}
}

func create(t *testing.T, st spate.Store, ks spate.Keyspace, key, value string) uint64 {
	t.Helper()
	o, err := st.Create(t.Context(), ks, key, []byte(value))
	require.NoError(t, err, "create %v %q", ks, key)
	require.True(t, o.Won, "create %v %q: won=false", ks, key)
	return o.Revision
}

func update(t *testing.T, st spate.Store, ks spate.Keyspace, key, value string, rev uint64) uint64 {
	t.Helper()
	o, err := st.Update(t.Context(), ks, key, []byte(value), rev)
	require.NoError(t, err, "update %v %q at %d", ks, key, rev)
	require.True(t, o.Won, "update %v %q at %d: won=false", ks, key, rev)
	return o.Revision
}

func open(t *testing.T, h *redisservers.Harness) *redis.Store {
	t.Helper()
	st, err := h.Open(t.Context())
	require.NoError(t, err, "open store")
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
	require.NoError(t, err, "after retries")
}

// TestCommittedWritesSurviveACrashWithAOF commits progress through the store
// on a server with appendonly yes and appendfsync always, kills the server
// (SIGKILL, no shutdown), starts it again on the same directory and checks
// that every committed value is there at its revision, and that revisions
// keep increasing.
func TestCommittedWritesSurviveACrashWithAOF(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
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
	require.NoError(t, err, "delete")
	require.True(t, o.Won, "delete: won=false")
	delete(want, "split.4")
	top = max(top, o.Revision)
	ch, _ := watch(t, st, spate.Durable, "split.")

	srv.Kill()

	ev := recv(t, ch, "the watch to break")
	require.Equal(t, spate.WatchError, ev.Kind, "a watch whose server died must end with a Retryable WatchError; got %v %v", ev.Kind, ev.Err)
	require.ErrorIs(t, ev.Err, spate.ErrRetryable, "a watch whose server died must end with a Retryable WatchError")
	_, _, err = st.Get(t.Context(), spate.Durable, "split.0")
	require.True(t, spate.IsRetryable(err), "get while the server is down: want Retryable, got %v", err)

	srv.StartAgain()

	check := func(name string, s spate.Store) {
		t.Helper()
		var list []spate.Entry
		retrying(t, func() (err error) { list, err = s.List(t.Context(), spate.Durable, "split."); return err })
		require.Len(t, list, len(want), "%s: after the crash the listing", name)
		for _, en := range list {
			w := want[en.Key]
			assert.Equal(t, string(w.Value), string(en.Value), "%s: after the crash %q reads %q@%d, committed %q@%d", name, en.Key, en.Value, en.Revision, w.Value, w.Revision)
			assert.Equal(t, w.Revision, en.Revision, "%s: after the crash %q reads %q@%d, committed %q@%d", name, en.Key, en.Value, en.Revision, w.Value, w.Revision)
		}
	}
	check("the same store", st)
	st2 := open(t, h)
	check("a new store", st2)
	next := update(t, st2, spate.Durable, "split.0", "w=4", want["split.0"].Revision)
	assert.Greater(t, next, top, "revisions must keep increasing across a restart")
	fresh := create(t, st, spate.Durable, "split.4", "again")
	assert.Greater(t, fresh, next, "revisions must keep increasing across a restart")
	t.Logf("before the crash revisions reached %d; after it the store minted %d and %d", top, next, fresh)
}

// TestJobsAreIsolated: two jobs on one server share nothing.
func TestJobsAreIsolated(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	a := open(t, srv.NewHarness(t, testTTL))
	b := open(t, srv.NewHarness(t, testTTL))
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, snap := watch(t, b, ks, "")
		require.Empty(t, snap, "%v: a fresh job's snapshot holds %d keys", ks, len(snap))
		ra := create(t, a, ks, "shared.k", "from-a")
		create(t, a, ks, "only-a", "x")
		rb := create(t, b, ks, "shared.k", "from-b")
		assert.Equal(t, uint64(1), ra, "%v: each job's revisions start at 1; a minted %d, b minted %d", ks, ra, rb)
		assert.Equal(t, uint64(1), rb, "%v: each job's revisions start at 1; a minted %d, b minted %d", ks, ra, rb)
		ev := recv(t, ch, "b's own put")
		assert.Equal(t, spate.WatchPut, ev.Kind, "%v: b's watch saw %v %q=%q, want its own put", ks, ev.Kind, ev.Key, ev.Value)
		assert.Equal(t, "shared.k", ev.Key, "%v: b's watch saw %v %q=%q, want its own put", ks, ev.Kind, ev.Key, ev.Value)
		assert.Equal(t, "from-b", string(ev.Value), "%v: b's watch saw %v %q=%q, want its own put", ks, ev.Kind, ev.Key, ev.Value)
		list, err := b.List(t.Context(), ks, "")
		require.NoError(t, err)
		if assert.Len(t, list, 1, "%v: b lists %v, want only its own key", ks, list) {
			assert.Equal(t, "from-b", string(list[0].Value), "%v: b lists %v, want only its own key", ks, list)
		}
		o, err := a.Delete(t.Context(), ks, "shared.k", spate.AnyRevision)
		require.NoError(t, err, "delete")
		require.True(t, o.Won, "delete: won=false")
		en, ok, err := b.Get(t.Context(), ks, "shared.k")
		assert.NoError(t, err, "%v: a's delete reached b", ks)
		assert.True(t, ok, "%v: a's delete reached b: the key is gone", ks)
		assert.Equal(t, "from-b", string(en.Value), "%v: a's delete reached b", ks)
	}
}

// TestWatchLagIsRetryable: a watcher that falls further behind than the
// change log keeps gets a Retryable error, after an unbroken run of events.
func TestWatchLagIsRetryable(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	h := srv.NewHarness(t, testTTL, redisservers.WithStoreOptions(func(o *redis.Options) {
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
			require.ErrorIs(t, ev.Err, spate.ErrRetryable, "a lagged watcher's error must be Retryable")
			t.Logf("after %d events in order: %v", last, ev.Err)
			break
		}
		require.Equal(t, spate.WatchPut, ev.Kind, "events before the lag error must be unbroken: got %v@%d after %d", ev.Kind, ev.Revision, last)
		require.Equal(t, last+1, ev.Revision, "events before the lag error must be unbroken: got %v@%d after %d", ev.Kind, ev.Revision, last)
		last = ev.Revision
		require.NotEqual(t, uint64(n), last, "the watcher saw all %d changes; a %d-entry change log should have been trimmed past it", n, redis.MinChangeLogLength)
	}
	_, more := <-ch
	assert.False(t, more, "the error must be the last event")
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
			srv := redisservers.Start(t)
			h := srv.NewHarness(t, testTTL, redisservers.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = sweep }))
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
				require.NoError(t, err)
				deadline[key] = int64(ms)
				time.Sleep(23 * time.Millisecond) // spread the deadlines across sweep phases
			}
			var lat []time.Duration
			for len(lat) < n {
				ev := recv(t, ch, "an expiry")
				if ev.Kind == spate.WatchPut {
					continue
				}
				require.Equal(t, spate.WatchDelete, ev.Kind, "unexpected %v: %v", ev.Kind, ev.Err)
				arrived := time.Now().UnixMilli()
				d := time.Duration(arrived-deadline[ev.Key]) * time.Millisecond
				assert.GreaterOrEqual(t, d, time.Duration(0), "rule: a key expires no earlier than its deadline; %q's delete arrived %v early", ev.Key, -d)
				assert.Greater(t, ev.Revision, revs[ev.Key], "expiry of %q at revision %d, not above its put at %d", ev.Key, ev.Revision, revs[ev.Key])
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
	srv := redisservers.Start(t)
	h := srv.NewHarness(t, ttl, redisservers.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = 10 * time.Millisecond }))
	ctx := t.Context()
	stores := make([]*redis.Store, clients+1)
	for i := range stores {
		stores[i] = open(t, h)
	}
	rec := &conformance.History{}
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		o, err := conformance.Recorder{H: rec, Client: 0, Store: stores[0]}.Create(ctx, ks, "ctr", []byte("0"))
		require.NoError(t, err, "create counter")
		require.True(t, o.Won, "create counter: won=false")
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
					if o, err := (conformance.Recorder{H: rec, Client: c, Store: s}).Create(ctx, spate.Durable, "flag", []byte("c"+strconv.Itoa(c))); err == nil && o.Won {
						_, _ = conformance.Recorder{H: rec, Client: c, Store: s}.Delete(ctx, spate.Durable, "flag", o.Revision)
					} else if err == nil {
						_, _ = conformance.Recorder{H: rec, Client: c, Store: s}.Delete(ctx, spate.Durable, "flag", spate.AnyRevision)
					}
					continue
				}
				en, ok, err := conformance.Recorder{H: rec, Client: c, Store: s}.Get(ctx, ks, "ctr")
				if err != nil || !ok {
					errs <- fmt.Errorf("client %d get %v: ok=%t err=%v", c, ks, ok, err)
					return
				}
				v, _ := strconv.Atoi(string(en.Value))
				o, err := conformance.Recorder{H: rec, Client: c, Store: s}.Update(ctx, ks, "ctr", []byte(strconv.Itoa(v+1)), en.Revision)
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
		require.NoError(t, err)
	}
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		en, ok, err := conformance.Recorder{H: rec, Client: 0, Store: stores[0]}.Get(ctx, ks, "ctr")
		require.NoError(t, err, "final get %v", ks)
		require.True(t, ok, "final get %v: ok=false", ks)
		got, _ := strconv.Atoi(string(en.Value))
		assert.Equal(t, won[ks], got, "rule: concurrent CAS increments lose no update; %v counter reads %d after %d won increments", ks, got, won[ks])
	}
	close(stop)
	wg.Wait()
	ok, info := rec.Check(60 * time.Second)
	require.True(t, ok, "rule: create, update and delete are linearizable; porcupine: %s", info)
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
	srv := redisservers.Start(t)
	proxy := redisservers.NewProxy(t, srv.Addr())
	h := srv.NewHarness(t, testTTL,
		redisservers.WithClientOptions(func(o *goredis.Options) { o.Addr = proxy.Addr() }), // go-redis defaults: MaxRetries 3
		redisservers.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = time.Hour }))
	st := open(t, h)
	ctx := t.Context()

	// Warm the server's script cache, so that the EVALSHA whose reply is
	// lost is one that runs (a NOSCRIPT reply would mean it did not).
	warm := create(t, st, spate.Durable, "warm", "v")
	warm = update(t, st, spate.Durable, "warm", "v", warm)
	o, err := st.Delete(ctx, spate.Durable, "warm", warm)
	require.NoError(t, err, "warm-up delete")
	require.True(t, o.Won, "warm-up delete: won=false")

	lose := func(op string, call func() (spate.Outcome, error)) {
		t.Helper()
		proxy.DropReplyTo("evalsha")
		o, err := call()
		require.False(t, proxy.Armed(), "%s: the proxy never saw the script", op)
		require.True(t, spate.IsRetryable(err), "%s whose reply was lost: want a Retryable error, got outcome %+v, err %v", op, o, err)
	}
	lose("create", func() (spate.Outcome, error) { return st.Create(ctx, spate.Durable, "lost.k", []byte("v1")) })
	en, ok, err := st.Get(ctx, spate.Durable, "lost.k")
	require.NoError(t, err, "the create landed: get")
	require.True(t, ok, "the create landed: get: absent")
	require.Equal(t, "v1", string(en.Value), "the create landed: get")
	lose("update", func() (spate.Outcome, error) {
		return st.Update(ctx, spate.Durable, "lost.k", []byte("v2"), en.Revision)
	})
	en2, ok, err := st.Get(ctx, spate.Durable, "lost.k")
	require.NoError(t, err, "the update landed: get")
	require.True(t, ok, "the update landed: get: absent")
	require.Equal(t, "v2", string(en2.Value), "the update landed: get")
	require.Greater(t, en2.Revision, en.Revision, "the update landed: get %q@%d", en2.Value, en2.Revision)
	lose("guarded delete", func() (spate.Outcome, error) { return st.Delete(ctx, spate.Durable, "lost.k", en2.Revision) })
	_, ok, err = st.Get(ctx, spate.Durable, "lost.k")
	require.NoError(t, err, "the delete landed: get")
	require.False(t, ok, "the delete landed: present=%t", ok)

	// Control: go-redis's own Script.Run retries after the lost reply, the
	// script runs twice, and the caller is told the create lost.
	raw := goredis.NewClient(&goredis.Options{Addr: proxy.Addr()})
	defer raw.Close()
	createIfAbsent := goredis.NewScript(`if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end redis.call('SET', KEYS[1], ARGV[1]) return 1`)
	require.NoError(t, createIfAbsent.Load(ctx, raw).Err())
	proxy.DropReplyTo("evalsha")
	won, err := createIfAbsent.Run(ctx, raw, []string{"control"}, "v").Int()
	require.NoError(t, err, "control: expected go-redis to retry the script and report 0 (lost) for a create that won")
	require.Equal(t, 0, won, "control: expected go-redis to retry the script and report 0 (lost) for a create that won")
	t.Log("control: a retried create-if-absent script reported lost for its own write; the driver runs scripts once")
}

// TestMassExpiryReachesWatchers: more keys expire at once than one sweep
// script handles, and nobody reads them; the sweeps still turn every one
// into exactly one delete for watchers, and the keyspace ends empty.
func TestMassExpiryReachesWatchers(t *testing.T) {
	t.Parallel()
	const n = 1300 // over two sweep batches
	srv := redisservers.Start(t)
	// The first sweep comes after every key is due, so it must loop over
	// several batches.
	h := srv.NewHarness(t, testTTL, redisservers.WithStoreOptions(func(o *redis.Options) { o.SweepInterval = 2 * testTTL }))
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
			require.False(t, deleted[ev.Key], "%q expired twice", ev.Key)
			assert.Greater(t, ev.Revision, put[ev.Key], "%q expired at revision %d, not above its put at %d", ev.Key, ev.Revision, put[ev.Key])
			deleted[ev.Key] = true
		default:
			require.FailNow(t, fmt.Sprintf("unexpected %v: %v", ev.Kind, ev.Err))
		}
	}
	list, err := st.List(t.Context(), spate.Ephemeral, "")
	assert.NoError(t, err, "list after every key expired")
	assert.Empty(t, list, "after every key expired the keyspace lists %d keys", len(list))
}

// TestCancelledWatchEnds: cancelling a watch's context closes its channel
// without an error event, while other watches of the store go on.
func TestCancelledWatchEnds(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	st := open(t, srv.NewHarness(t, testTTL))
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := st.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	require.Equal(t, spate.WatchSnapshotDone, recv(t, ch, "SnapshotDone").Kind)
	other, _ := watch(t, st, spate.Durable, "")
	cancel()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for alive := true; alive; {
		select {
		case ev, ok := <-ch:
			if ok {
				assert.NotEqual(t, spate.WatchError, ev.Kind, "a cancelled watch ends without an error event; got %v", ev.Err)
			}
			alive = ok
		case <-timer.C:
			require.FailNow(t, fmt.Sprintf("a cancelled watch's channel is still open after %v", eventWait))
		}
	}
	create(t, st, spate.Durable, "after", "v")
	ev := recv(t, other, "the put")
	assert.Equal(t, spate.WatchPut, ev.Kind, "the other watch saw %v %q", ev.Kind, ev.Key)
	assert.Equal(t, "after", ev.Key, "the other watch saw %v %q", ev.Kind, ev.Key)
}
