package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
)

// open opens a store with its own client on the shared cluster.
func open(t *testing.T, prefix string, edit func(*clientv3.Config)) *etcd.Store {
	t.Helper()
	return openOn(t, etcdservers.Shared(t), prefix, edit)
}

// openOn opens a store with its own client on cluster c.
func openOn(t *testing.T, c *etcdservers.Cluster, prefix string, edit func(*clientv3.Config)) *etcd.Store {
	t.Helper()
	s, err := etcd.New(t.Context(), c.Client(t, edit), opts(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// recv receives one event or fails after d.
func recv(t *testing.T, ch <-chan spate.WatchEvent, d time.Duration, what string) spate.WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "watch closed while waiting for %s", what)
		return ev
	case <-time.After(d):
		require.FailNow(t, fmt.Sprintf("no watch event within %v while waiting for %s", d, what))
	}
	return spate.WatchEvent{}
}

func snapshotDone(t *testing.T, ch <-chan spate.WatchEvent) {
	t.Helper()
	for {
		ev := recv(t, ch, 10*time.Second, "SnapshotDone")
		if ev.Kind == spate.WatchSnapshotDone {
			return
		}
		require.Equal(t, spate.WatchPut, ev.Kind)
	}
}

func TestOptionsValidated(t *testing.T) {
	t.Parallel()
	cli := etcdservers.Shared(t).Client(t, nil)
	good := opts(etcdservers.FreshPrefix())
	for _, tc := range []struct {
		name    string
		edit    func(*etcd.Options)
		mention string
	}{
		{"NoPrefix", func(o *etcd.Options) { o.Prefix = "" }, "Prefix is required"},
		{"PrefixWithoutTrailingSlash", func(o *etcd.Options) { o.Prefix = "/spate/job" }, "must end with '/'"},
		{"PrefixWithSpace", func(o *etcd.Options) { o.Prefix = "/spate/my job/" }, "outside"},
		{"PrefixTooLong", func(o *etcd.Options) { o.Prefix = "/" + string(make([]byte, etcd.PrefixMaxLen)) + "/" }, "longer than"},
		{"NoTTL", func(o *etcd.Options) { o.TTL = 0 }, "TTL must be positive"},
		{"FractionalTTL", func(o *etcd.Options) { o.TTL = 1500 * time.Millisecond }, "whole number of seconds"},
		{"NegativeValueCap", func(o *etcd.Options) { o.MaxValueSize = -1 }, "MaxValueSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			_, err := etcd.New(t.Context(), cli, o)
			requireFatal(t, err, tc.mention)
		})
	}
	_, err := etcd.New(t.Context(), nil, good)
	requireFatal(t, err, "client is nil")
}

// TestTTLFloor pins the server's minimum lease TTL: 1.5 election timeouts
// rounded up to whole seconds. The test cluster (500 ms elections) has a
// 1 s floor; etcd's default timing (100 ms heartbeat, 1 s election) a 2 s
// floor, which New enforces.
func TestTTLFloor(t *testing.T) {
	t.Parallel()
	s := open(t, etcdservers.FreshPrefix(), nil)
	require.Equal(t, time.Second, s.Capabilities().TTLFloor)

	c := etcdservers.Start(t, etcdservers.Options{TickMs: 100, ElectionMs: 1000})
	cli := c.Client(t, nil)
	o := opts(etcdservers.FreshPrefix())
	o.TTL = time.Second
	_, err := etcd.New(t.Context(), cli, o)
	requireFatal(t, err, "minimum lease TTL of 2s")
	o.TTL = 2 * time.Second
	s2, err := etcd.New(t.Context(), cli, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close() })
	require.Equal(t, 2*time.Second, s2.Capabilities().TTLFloor)
}

func TestCapabilities(t *testing.T) {
	t.Parallel()
	c := open(t, etcdservers.FreshPrefix(), nil).Capabilities()
	require.Equal(t, "etcd", c.Driver)
	require.Equal(t, testTTL, c.TTL)
	require.True(t, c.LinearizableFailover)
	require.Equal(t, etcd.DefaultMaxValueSize, c.MaxValueSize)
	require.Equal(t, etcd.ExpiryLatency, c.ExpiryLatency)
	require.NotEmpty(t, c.Durability)
	require.NotEmpty(t, c.RequiredSettings)
}

// TestPrefixesIsolateJobs runs two jobs on one cluster whose prefixes share
// a string prefix ("a/" and "ab/"): neither sees the other's keys in
// listings, reads or watches.
func TestPrefixesIsolateJobs(t *testing.T) {
	t.Parallel()
	base := etcdservers.FreshPrefix()
	a, b := open(t, base+"a/", nil), open(t, base+"ab/", nil)
	ctx := t.Context()
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		wa, err := a.Watch(ctx, ks, "")
		require.NoError(t, err)
		wb, err := b.Watch(ctx, ks, "")
		require.NoError(t, err)
		snapshotDone(t, wa)
		snapshotDone(t, wb)

		// b writes first: if a's watch could see b's keys, they would
		// arrive before a's own.
		rb, err := b.Create(ctx, ks, "k", []byte("from-b"))
		require.NoError(t, err)
		ra, err := a.Create(ctx, ks, "k", []byte("from-a"))
		require.NoError(t, err)
		require.True(t, ra.Won, "a's create must not collide with b's key")
		_, err = b.Create(ctx, ks, "only-b", []byte("b"))
		require.NoError(t, err)
		_, err = a.Delete(ctx, ks, "k", spate.AnyRevision)
		require.NoError(t, err)
		_, err = a.Create(ctx, ks, "marker", []byte("a"))
		require.NoError(t, err)

		var gotA []string
		for ev := recv(t, wa, 10*time.Second, "a's events"); ; ev = recv(t, wa, 10*time.Second, "a's events") {
			gotA = append(gotA, fmt.Sprintf("%v %s", ev.Kind, ev.Key))
			if ev.Key == "k" && ev.Kind == spate.WatchPut {
				require.Equal(t, "from-a", string(ev.Value))
				require.Equal(t, ra.Revision, ev.Revision)
			}
			if ev.Key == "marker" {
				break
			}
		}
		require.Equal(t, []string{"put k", "delete k", "put marker"}, gotA, "%v: a's watch sees exactly a's changes", ks)
		ev := recv(t, wb, 10*time.Second, "b's first event")
		require.Equal(t, spate.WatchPut, ev.Kind)
		require.Equal(t, "k", ev.Key)
		require.Equal(t, rb.Revision, ev.Revision, "%v: b's watch sees b's key, not a's", ks)
		ev = recv(t, wb, 10*time.Second, "b's second event")
		require.Equal(t, "only-b", ev.Key, "%v: b's watch sees none of a's changes", ks)

		la, err := a.List(ctx, ks, "")
		require.NoError(t, err)
		require.Equal(t, []string{"marker"}, keys(la), "%v: a lists only its own keys", ks)
		lb, err := b.List(ctx, ks, "")
		require.NoError(t, err)
		require.Equal(t, []string{"k", "only-b"}, keys(lb), "%v: b lists only its own keys", ks)
		en, ok, err := b.Get(ctx, ks, "k")
		require.NoError(t, err)
		require.True(t, ok, "%v: a's delete must not remove b's key", ks)
		require.Equal(t, "from-b", string(en.Value))
	}
}

func keys(es []spate.Entry) []string {
	var ks []string
	for _, e := range es {
		ks = append(ks, e.Key)
	}
	return ks
}

// TestCompactionBreaksWatchRetryable cuts a watcher off (a proxy between
// its client and the server drops the connection), moves the keyspace on and
// compacts it while the watcher is away. When the client reconnects, etcd
// can no longer resume the watch from where it was: the stream must end
// with a Retryable error that names compaction, after delivering nothing
// out of order. It runs on a cluster of its own: compacting the shared
// cluster breaks every other test's watch that is still catching up from
// a revision below the compaction (stop 54's CI lost TestPrefixesIsolateJobs
// and TestWatchKeysSlowWatcherIsCutRetryable to it).
func TestCompactionBreaksWatchRetryable(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	proxy := etcdservers.NewProxy(t, c.Members()[0].ClientURL.Host)
	prefix := etcdservers.FreshPrefix()
	ctx := t.Context()
	watcher := openOn(t, c, prefix, func(cfg *clientv3.Config) { cfg.Endpoints = []string{"http://" + proxy.Addr()} })
	writer := openOn(t, c, prefix, nil)

	ch, err := watcher.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	snapshotDone(t, ch)
	o, err := writer.Create(ctx, spate.Durable, "k", []byte("0"))
	require.NoError(t, err)
	ev := recv(t, ch, 10*time.Second, "the create")
	require.Equal(t, o.Revision, ev.Revision)

	proxy.Block()
	rev := o.Revision
	for i := 1; i <= 5; i++ {
		u, err := writer.Update(ctx, spate.Durable, "k", []byte(fmt.Sprint(i)), rev)
		require.NoError(t, err)
		require.True(t, u.Won)
		rev = u.Revision
	}
	admin := c.Client(t, nil)
	_, err = admin.Compact(ctx, int64(rev))
	require.NoError(t, err)
	proxy.Unblock()

	for {
		ev := recv(t, ch, 30*time.Second, "the compaction error")
		if ev.Kind == spate.WatchError {
			requireRetryable(t, ev.Err, "compact")
			break
		}
		// Anything delivered before the error must be in order.
		require.Equal(t, spate.WatchPut, ev.Kind)
		require.Greater(t, ev.Revision, o.Revision)
	}
	select {
	case _, ok := <-ch:
		require.False(t, ok, "the error is the last event")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the watch channel stays open after its error")
	}
}

// TestExpiryLatency measures how late ephemeral expiry reaches a watcher,
// from the key's deadline (its create call plus the TTL) to the delete
// event, and checks that no key expires early.
func TestExpiryLatency(t *testing.T) {
	t.Parallel()
	s := open(t, etcdservers.FreshPrefix(), nil)
	ctx := t.Context()
	ch, err := s.Watch(ctx, spate.Ephemeral, "lat.")
	require.NoError(t, err)
	snapshotDone(t, ch)
	const n = 8
	called := map[string]time.Time{}
	put := map[string]bool{}
	var lat []time.Duration
	// Each key's put, then its delete. On a loaded machine the creates
	// below can outlast the TTL, so an early key's expiry may come before
	// a later key's put.
	take := func(ev spate.WatchEvent) {
		switch ev.Kind {
		case spate.WatchPut:
			require.False(t, put[ev.Key], "a second put of %s", ev.Key)
			put[ev.Key] = true
		case spate.WatchDelete:
			require.True(t, put[ev.Key], "%s deleted before its put reached the watch", ev.Key)
			late := time.Since(called[ev.Key].Add(testTTL))
			require.GreaterOrEqual(t, late, time.Duration(0), "rule: an ephemeral key never expires before its TTL; %s expired %v early", ev.Key, -late)
			lat = append(lat, late)
		default:
			require.Failf(t, "unexpected watch event", "%v %q", ev.Kind, ev.Key)
		}
	}
	for i := range n {
		k := fmt.Sprintf("lat.k%d", i)
		called[k] = time.Now()
		o, err := s.Create(ctx, spate.Ephemeral, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		for !put[k] {
			take(recv(t, ch, 10*time.Second, "a put"))
		}
		time.Sleep(120 * time.Millisecond) // spread the deadlines over the server's 500 ms expiry scan
	}
	for len(lat) < n {
		take(recv(t, ch, testTTL+10*time.Second, "an expiry"))
	}
	slices.Sort(lat)
	t.Logf("expiry-to-watch latency over %d keys (TTL %v): min %v, median %v, max %v (reported ExpiryLatency %v)",
		n, testTTL, lat[0].Round(time.Millisecond), lat[n/2].Round(time.Millisecond), lat[n-1].Round(time.Millisecond), etcd.ExpiryLatency)
}

// TestLeasesDoNotLeak counts the leases on a server of its own while the
// store writes, loses and deletes ephemeral keys.
func TestLeasesDoNotLeak(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	admin := c.Client(t, nil)
	ctx := t.Context()
	count := func() int {
		t.Helper()
		resp, err := admin.Leases(ctx)
		require.NoError(t, err)
		return len(resp.Leases)
	}
	// The test counts leases revoked, not expired: its key must outlive
	// every write below however slow the machine. With the 2 s test TTL,
	// beside 2 busy processes, "k" expired during the ten lost writes and
	// a later Create of it won.
	so := opts(etcdservers.FreshPrefix())
	so.TTL = time.Minute
	s, err := etcd.New(ctx, c.Client(t, nil), so)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	reaped := make(chan clientv3.LeaseID, 64)
	etcd.SetReapHook(s, func(id clientv3.LeaseID) { reaped <- id })
	require.Equal(t, 0, count(), "the startup check revokes its lease")

	o, err := s.Create(ctx, spate.Ephemeral, "k", []byte("v"))
	require.NoError(t, err)
	require.True(t, o.Won)
	for range 10 {
		lost, err := s.Create(ctx, spate.Ephemeral, "k", []byte("v"))
		require.NoError(t, err)
		require.False(t, lost.Won)
		stale, err := s.Update(ctx, spate.Ephemeral, "k", []byte("v"), o.Revision+1000)
		require.NoError(t, err)
		require.False(t, stale.Won)
	}
	require.Equal(t, 1, count(), "a write that lost revokes its lease before returning")

	rev := o.Revision
	const beats = 10
	for range beats {
		u, err := s.Update(ctx, spate.Ephemeral, "k", []byte("v"), rev)
		require.NoError(t, err)
		require.True(t, u.Won)
		rev = u.Revision
	}
	for range beats {
		recvLease(t, reaped)
	}
	require.Equal(t, 1, count(), "each heartbeat's superseded lease is revoked")

	d, err := s.Delete(ctx, spate.Ephemeral, "k", rev)
	require.NoError(t, err)
	require.True(t, d.Won)
	recvLease(t, reaped)
	require.Equal(t, 0, count(), "a guarded delete revokes the key's lease")

	_, err = s.Create(ctx, spate.Ephemeral, "k2", []byte("v"))
	require.NoError(t, err)
	_, err = s.Delete(ctx, spate.Ephemeral, "k2", spate.AnyRevision)
	require.NoError(t, err)
	recvLease(t, reaped)
	require.Equal(t, 0, count(), "an unguarded delete revokes the key's lease")
}

func recvLease(t *testing.T, ch <-chan clientv3.LeaseID) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no background lease revocation within 10s")
	}
}

// TestClientClosedByOwnerIsFatal: a store whose client its owner closed
// can never succeed again, so it says so instead of retrying forever.
func TestClientClosedByOwnerIsFatal(t *testing.T) {
	t.Parallel()
	cli := etcdservers.Shared(t).Client(t, nil)
	s, err := etcd.New(t.Context(), cli, opts(etcdservers.FreshPrefix()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, cli.Close())
	_, _, err = s.Get(t.Context(), spate.Durable, "k")
	requireFatal(t, err, "closed by its owner")
	require.False(t, errors.Is(err, spate.ErrRetryable))
	_, err = s.Create(context.Background(), spate.Durable, "k", nil)
	requireFatal(t, err, "closed by its owner")
}

// TestSlowWatcherIsCutRetryable: a consumer that falls more than
// WatchBuffer events behind loses its stream with a Retryable error instead
// of making the driver (or etcd's client) buffer without bound.
func TestSlowWatcherIsCutRetryable(t *testing.T) {
	t.Parallel()
	o := opts(etcdservers.FreshPrefix())
	o.WatchBuffer = 3
	s, err := etcd.New(t.Context(), etcdservers.Shared(t).Client(t, nil), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	lagged := make(chan struct{}, 1)
	etcd.SetLagHook(s, func() { lagged <- struct{}{} })
	ctx := t.Context()
	ch, err := s.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	for i := range 10 { // never read meanwhile
		_, err := s.Create(ctx, spate.Durable, fmt.Sprintf("k%d", i), []byte("v"))
		require.NoError(t, err)
	}
	select {
	case <-lagged:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "a watcher 10 events behind with a buffer of 3 was not cut")
	}
	ev := recv(t, ch, 10*time.Second, "the lag error")
	require.Equal(t, spate.WatchError, ev.Kind, "what was queued is dropped; the error comes first")
	requireRetryable(t, ev.Err, "behind")
	_, ok := <-ch
	require.False(t, ok, "the error is the last event")
}
