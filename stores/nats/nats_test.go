package nats_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// testCtx is a context bounded well inside the test timeout.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, nc *natsgo.Conn, opts spatenats.Options) *spatenats.Store {
	t.Helper()
	s, err := spatenats.New(testCtx(t, 10*time.Second), nc, opts)
	require.NoError(t, err, "open store")
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// jobStreams returns a JetStream handle on nc and the names of job's two
// streams by keyspace ([0] durable, [1] ephemeral), for tests that reach
// behind the driver.
func jobStreams(t *testing.T, nc *natsgo.Conn, job string) (jetstream.JetStream, [2]string) {
	t.Helper()
	js, err := jetstream.New(nc)
	require.NoError(t, err, "jetstream")
	dname, ename := spatenats.Buckets(job)
	return js, [2]string{"KV_" + dname, "KV_" + ename}
}

// mustCreate creates key in ks and fails the test unless the write wins.
func mustCreate(t *testing.T, ctx context.Context, s spate.Store, ks spate.Keyspace, key string) {
	t.Helper()
	o, err := s.Create(ctx, ks, key, []byte("v"))
	require.NoError(t, err, "create %v %q", ks, key)
	require.True(t, o.Won, "create %v %q: won=%t", ks, key, o.Won)
}

// roundTrip writes and reads one key in each keyspace.
func roundTrip(t *testing.T, s spate.Store) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		o, err := s.Create(ctx, ks, "rt.k", []byte("v"))
		require.NoError(t, err, "%v create", ks)
		require.True(t, o.Won, "%v create: won=%t", ks, o.Won)
		e, ok, err := s.Get(ctx, ks, "rt.k")
		require.NoError(t, err, "%v get", ks)
		require.True(t, ok, "%v get: %+v ok=%t", ks, e, ok)
		require.Equal(t, "v", string(e.Value), "%v get: %+v", ks, e)
		require.Equal(t, o.Revision, e.Revision, "%v get: %+v", ks, e)
	}
}

// requireFatal checks that err is Fatal (and not Retryable) and says each
// of says.
func requireFatal(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	require.Error(t, err, "%s: want a Fatal error, got none", what)
	require.True(t, spate.IsFatal(err), "%s: want Fatal, got %v", what, err)
	require.NotErrorIs(t, err, spate.ErrRetryable, "%s: want Fatal", what)
	for _, s := range says {
		assert.ErrorContains(t, err, s, "%s: the error should say %q", what, s)
	}
}

func requireRetryable(t *testing.T, what string, err error) {
	t.Helper()
	require.Error(t, err, "%s: want Retryable", what)
	require.True(t, spate.IsRetryable(err), "%s: want Retryable, got %v", what, err)
}

// TestAuthAndTLS connects with each kind of credentials and TLS, end to end,
// and requires bad credentials to be a clear Fatal error at startup, well
// before the dial's deadline.
func TestAuthAndTLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    []natsservers.Option
		badSays string
	}{
		{"user-password", []natsservers.Option{natsservers.WithUserPassword("spate", "s3cret")}, "authentication failed"},
		{"token", []natsservers.Option{natsservers.WithToken("t0ken")}, "authentication failed"},
		{"nkey", []natsservers.Option{natsservers.WithNkey()}, "authentication failed"},
		{"creds", []natsservers.Option{natsservers.WithCreds()}, "authentication failed"},
		{"tls", []natsservers.Option{natsservers.WithTLS(false)}, ""},
		{"mutual-tls", []natsservers.Option{natsservers.WithTLS(true), natsservers.WithUserPassword("spate", "pw")}, "authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natsservers.Start(t, tc.opts...)
			nc, err := spatenats.Connect(testCtx(t, 10*time.Second), srv.URL, srv.ClientOptions...)
			require.NoError(t, err, "connect with good credentials")
			t.Cleanup(nc.Close)
			s := open(t, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
			roundTrip(t, s)

			if tc.badSays == "" {
				return
			}
			bad, err := srv.BadClientOptions()
			require.NoError(t, err, "bad credentials")
			ctx := testCtx(t, 10*time.Second)
			nc2, err := spatenats.Connect(ctx, srv.URL, bad...)
			if nc2 != nil {
				nc2.Close()
			}
			require.NoError(t, ctx.Err(), "bad credentials must fail at once, not at the dial's deadline: %v", err)
			requireFatal(t, "connect with bad credentials", err, tc.badSays)
		})
	}
}

// TestTLSMisconfiguration: a client that does not trust the server's CA
// gets a Fatal error naming TLS. A client that omits the certificate a
// server requires is refused by TLS 1.3 after the handshake: when the
// server's alert reaches the client first it is Fatal; when the server has
// already closed the connection, nats.go reports ErrTLS over a broken pipe
// or EOF, which a reset connection also produces, and the driver leaves it
// Retryable.
func TestTLSMisconfiguration(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithTLS(true))
	ctx := testCtx(t, 10*time.Second)
	_, err := spatenats.Connect(ctx, srv.URL, natsgo.Secure(nil))
	requireFatal(t, "connect without trusting the CA", err, "TLS certificate verification failed")
	for range 5 {
		_, err = spatenats.Connect(ctx, srv.URL, natsgo.RootCAs(srv.CAFile))
		if errors.Is(err, natsgo.ErrTLS) {
			requireRetryable(t, "connect without a client certificate, connection closed", err)
		} else {
			requireFatal(t, "connect without a client certificate, alert received", err, "refused the TLS handshake")
		}
	}
	require.NoError(t, ctx.Err(), "TLS failures must be immediate")
}

// TestBadCredentialsOnRetryingConnection: a connection made with
// RetryOnFailedConnect never fails nats.Connect; nats.go closes it after the
// server rejected the credentials twice, and New must refuse it with a
// Fatal error that says why.
func TestBadCredentialsOnRetryingConnection(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithUserPassword("spate", "pw"))
	closed := make(chan struct{})
	nc, err := natsgo.Connect(srv.URL, natsgo.UserInfo("spate", "wrong"), natsgo.RetryOnFailedConnect(true),
		natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond),
		natsgo.ClosedHandler(func(*natsgo.Conn) { close(closed) }))
	require.NoError(t, err, "RetryOnFailedConnect returns a connection")
	t.Cleanup(nc.Close)
	select {
	case <-closed:
	case <-testCtx(t, 10*time.Second).Done():
		require.FailNow(t, "nats.go never gave up on the rejected credentials")
	}
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	requireFatal(t, "open over a connection whose credentials were rejected", err, "authentication failed")
}

func TestUnreachableServerIsRetryable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	_ = l.Close()
	_, err = spatenats.Connect(testCtx(t, 10*time.Second), "nats://"+addr)
	requireRetryable(t, "connect to a closed port", err)
}

// TestServerLossIsRetryable: with the server gone, operations time out as
// Retryable errors and a store cannot be opened over the reconnecting
// connection (Retryable); over a connection closed by its owner, Fatal.
func TestServerLossIsRetryable(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	s := open(t, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := s.Create(ctx, spate.Durable, "k", []byte("v"))
	requireRetryable(t, "create with the server down", err)
	_, err = spatenats.New(testCtx(t, 5*time.Second), nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	requireRetryable(t, "open over a reconnecting connection", err)
	nc.Close()
	_, _, err = s.Get(testCtx(t, 5*time.Second), spate.Durable, "k")
	requireFatal(t, "get over a connection its owner closed", err, "closed")
	_, err = spatenats.New(testCtx(t, 5*time.Second), nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	requireFatal(t, "open over a closed connection", err, "closed")
}

// TestExistingBucketWithOtherTTLIsFatal: a job's buckets fix the lease TTL;
// reopening with another is Fatal, names both buckets and says how to fix
// it. Other settings that cannot serve are Fatal too.
func TestExistingBucketWithOtherTTLIsFatal(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	first := open(t, nc, spatenats.Options{Job: job, TTL: ttl})
	roundTrip(t, first)
	dname, ename := spatenats.Buckets(job)

	_, err := spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: job, TTL: 3 * time.Second})
	requireFatal(t, "reopen with another TTL", err, "lease duration cannot change mid-job", "finish the job or delete buckets", dname, ename)

	again := open(t, nc, spatenats.Options{Job: job, TTL: ttl})
	e, ok, err := again.Get(testCtx(t, 5*time.Second), spate.Durable, "rt.k")
	require.NoError(t, err, "reopening with the same settings adopts the buckets and their data")
	require.True(t, ok, "reopening with the same settings adopts the buckets and their data; got %+v %t", e, ok)
	require.Equal(t, "v", string(e.Value), "reopening with the same settings adopts the buckets and their data; got %+v", e)

	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: job, TTL: ttl, Storage: jetstream.MemoryStorage})
	requireFatal(t, "reopen with another storage", err, "storage", dname)

	// A bucket made with the plain KV API has direct get on.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kvJob := natsservers.NewJob()
	kd, _ := spatenats.Buckets(kvJob)
	_, err = js.CreateKeyValue(testCtx(t, 5*time.Second), jetstream.KeyValueConfig{Bucket: kd})
	require.NoError(t, err)
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: kvJob, TTL: ttl})
	requireFatal(t, "adopt a KV bucket with direct get", err, "direct get")

	// R3 on a single server: the server refuses the configuration.
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl, Replicas: 3})
	requireFatal(t, "R3 on a server without a cluster", err)
}

// TestOldServerIsFatal: a real server behind a proxy that reports version
// 2.10.22 in its INFO is refused with an error that says to upgrade.
func TestOldServerIsFatal(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	target := strings.TrimPrefix(srv.URL, "nats://")
	proxy := natsservers.VersionProxy(t, target, "2.10.22")
	nc, err := natsgo.Connect(proxy)
	require.NoError(t, err, "connect through the proxy")
	t.Cleanup(nc.Close)
	require.Equal(t, "2.10.22", nc.ConnectedServerVersion(), "the proxy should report 2.10.22")
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	requireFatal(t, "open on a 2.10 server", err, "2.10.22", "2.11", "upgrade")

	// The same proxy reporting the real version works end to end.
	proxy = natsservers.VersionProxy(t, target, srv.Version())
	nc2, err := natsgo.Connect(proxy)
	require.NoError(t, err)
	t.Cleanup(nc2.Close)
	roundTrip(t, open(t, nc2, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl}))
}

// eventWait bounds the wait for a watch event the tests expect: a watch
// delivers a change or breaks within WatchStallBound; three of it leave a
// loaded machine its latency on top.
const eventWait = 3 * spatenats.WatchStallBound

func recv(t *testing.T, ch <-chan spate.WatchEvent, what string) spate.WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "watch closed while waiting for %s", what)
		return ev
	case <-time.After(eventWait):
		require.FailNow(t, fmt.Sprintf("no watch event within %v while waiting for %s", eventWait, what))
	}
	return spate.WatchEvent{}
}

// TestWatchEmptyBucket: a watch of a bucket that never held a message, and
// of one that holds only delete markers, gets SnapshotDone at once.
func TestWatchEmptyBucket(t *testing.T) {
	t.Parallel()
	h := natsservers.NewHarness(t, ttl)
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 20*time.Second)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, err := s.Watch(ctx, ks, "")
		require.NoError(t, err)
		ev := recv(t, ch, "SnapshotDone on an empty bucket")
		require.Equal(t, spate.WatchSnapshotDone, ev.Kind, "%v: an empty bucket's watch starts with SnapshotDone; got %v %q", ks, ev.Kind, ev.Key)
	}
	for i := range 3 {
		k := fmt.Sprintf("gone.%d", i)
		o, err := s.Create(ctx, spate.Durable, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won, "create %q", k)
		d, err := s.Delete(ctx, spate.Durable, k, o.Revision)
		require.NoError(t, err)
		require.True(t, d.Won, "delete %q", k)
	}
	ch, err := s.Watch(ctx, spate.Durable, "gone.")
	require.NoError(t, err)
	ev := recv(t, ch, "SnapshotDone over markers only")
	require.Equal(t, spate.WatchSnapshotDone, ev.Kind, "a bucket of delete markers has an empty snapshot; got %v %q", ev.Kind, ev.Key)
}

// TestPrefixMidSegment: spate prefixes may end inside a key segment; the
// driver matches "has this string prefix" exactly, in List and Watch.
func TestPrefixMidSegment(t *testing.T) {
	t.Parallel()
	h := natsservers.NewHarness(t, ttl)
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 20*time.Second)
	for _, k := range []string{"spl", "split.1", "split.2.x", "splat", "sp", "sp.l", "other.spl", "s"} {
		o, err := s.Create(ctx, spate.Durable, k, []byte(k))
		require.NoError(t, err, "create %q", k)
		require.True(t, o.Won, "create %q", k)
	}
	for prefix, want := range map[string][]string{
		"spl":      {"spl", "splat", "split.1", "split.2.x"},
		"split.":   {"split.1", "split.2.x"},
		"split.2":  {"split.2.x"},
		"sp":       {"sp", "sp.l", "splat", "spl", "split.1", "split.2.x"},
		"sp.":      {"sp.l"},
		"other.sp": {"other.spl"},
		"x":        nil,
	} {
		slices.Sort(want)
		list, err := s.List(ctx, spate.Durable, prefix)
		require.NoError(t, err)
		var got []string
		for _, e := range list {
			got = append(got, e.Key)
		}
		assert.Equal(t, want, got, "list %q", prefix)
		ch, err := s.Watch(ctx, spate.Durable, prefix)
		require.NoError(t, err)
		got = nil
		for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
			got = append(got, ev.Key)
		}
		assert.Equal(t, want, got, "watch %q snapshot", prefix)
	}
	// Live events obey the same rule.
	ch, err := s.Watch(ctx, spate.Durable, "spl")
	require.NoError(t, err)
	for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
	}
	for _, k := range []string{"sp.x", "sq", "splx", "s.spl", "spl.y"} {
		_, err = s.Create(ctx, spate.Durable, k, []byte("v"))
		require.NoError(t, err)
	}
	for _, want := range []string{"splx", "spl.y"} {
		assert.Equal(t, want, recv(t, ch, want).Key, "live event for prefix %q", "spl")
	}
}

// TestLeaseExpiryLatency measures how long after its TTL an untouched
// lease's expiry reaches a watcher, on one server and on an R3 cluster, and
// requires that it never arrives before the TTL. Run with -v to see the
// numbers.
func TestLeaseExpiryLatency(t *testing.T) {
	// Not parallel (the package's other tests wait for it): the latencies
	// it logs measure the driver, and beside other tests they would
	// measure the machine's load.
	t.Run("R1", func(t *testing.T) {
		t.Parallel()
		measureExpiry(t, natsservers.NewHarness(t, ttl))
	})
	t.Run("R3", func(t *testing.T) {
		t.Parallel()
		c := natsservers.StartCluster(t, 3, natsservers.WithSyncAlways())
		measureExpiry(t, c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3}))
	})
}

func measureExpiry(t *testing.T, h *natsservers.Harness) {
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 60*time.Second)
	ch, err := s.Watch(ctx, spate.Ephemeral, "lat.")
	require.NoError(t, err)
	require.Equal(t, spate.WatchSnapshotDone, recv(t, ch, "SnapshotDone").Kind)
	const n = 8
	written := map[string]time.Time{}
	for i := range n {
		k := fmt.Sprintf("lat.%d", i)
		before := time.Now()
		o, err := s.Create(ctx, spate.Ephemeral, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won, "create %q", k)
		written[k] = before
		ev := recv(t, ch, "put of "+k)
		require.Equal(t, spate.WatchPut, ev.Kind, "got %v %q", ev.Kind, ev.Key)
		require.Equal(t, k, ev.Key, "got %v %q", ev.Kind, ev.Key)
		// Stagger the writes across the one-second marker precision.
		time.Sleep(time.Second / n)
	}
	var lat []time.Duration
	for len(lat) < n {
		ev := recv(t, ch, "an expiry")
		require.Equal(t, spate.WatchDelete, ev.Kind, "only expiries are due; got %v %q", ev.Kind, ev.Key)
		late := time.Since(written[ev.Key]) - ttl
		assert.GreaterOrEqual(t, late, time.Duration(0), "rule: a lease lives at least its TTL; %q expired %v early", ev.Key, -late)
		lat = append(lat, late)
	}
	slices.Sort(lat)
	t.Logf("R%d: lease expiry to watch latency after a %v TTL over %d keys (from before the Create call): min %v, median %v, max %v (reported ExpiryLatency %v)",
		max(1, h.Options().Replicas), ttl, n, lat[0].Round(time.Millisecond), lat[n/2].Round(time.Millisecond), lat[n-1].Round(time.Millisecond), s.Capabilities().ExpiryLatency)
}

// TestWatchSnapshotNeverUnderReports: while other keys churn and the stable
// keys are rewritten, every watch snapshot holds every stable key. A
// snapshot taken as a walk over the stream alone misses keys rewritten
// behind the walk; this is what the subject index in the snapshot is for.
func TestWatchSnapshotNeverUnderReports(t *testing.T) {
	// Not parallel: on a loaded machine the churner rewrites fewer
	// ephemeral keys within a TTL, and the checks of the others are left
	// out; alone, nearly all of them run.
	var stable []string
	for i := range 40 {
		stable = append(stable, fmt.Sprintf("su.stable.%02d", i))
	}
	snapshotsUnderChurn(t, stable, func(i int) []string { return []string{fmt.Sprintf("su.churn.%d", i%7)} },
		func(ctx context.Context, s *spatenats.Store, ks spate.Keyspace) (<-chan spate.WatchEvent, error) {
			return s.Watch(ctx, ks, "su.")
		}, nil)
}

// snapshotsUnderChurn is the load of the snapshot tests (prefix and key
// watches): on each keyspace, the stable keys are created, then a second
// client rewrites them one after another, and creates and deletes the
// keys churn(i) names in its turn i, while 15 watches are opened one
// after another; each one's snapshot must hold every stable key that was
// live throughout it, and pass check (if any).
//
// A durable stable key is live throughout every snapshot. An ephemeral
// one is only if a write of it that had completed when the watch was
// opened began less than a TTL before the snapshot ended (a key lives at
// least a TTL from the start of its last write): on a loaded machine the
// second client may not come round to rewrite a key within the 2 s TTL,
// and a snapshot that leaves out a key that expired is right. A stable
// key the second client finds expired (its update lost) is created again.
func snapshotsUnderChurn(t *testing.T, stable []string, churn func(i int) []string,
	watch func(ctx context.Context, s *spatenats.Store, ks spate.Keyspace) (<-chan spate.WatchEvent, error),
	check func(t *testing.T, ks spate.Keyspace, round int, have map[string]uint64)) {
	t.Helper()
	h := natsservers.NewHarness(t, ttl)
	ctx := testCtx(t, 60*time.Second)
	s, err := h.NewNATSStore(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	churner, err := h.NewNATSStore(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = churner.Close() })
	storeTTL := s.Capabilities().TTL
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		var mu sync.Mutex
		written := map[string]time.Time{} // each stable key's last won write, from before its call
		revs := make([]uint64, len(stable))
		for i, k := range stable {
			began := time.Now()
			o, err := s.Create(ctx, ks, k, []byte("v"))
			require.NoError(t, err)
			require.True(t, o.Won, "create %s", k)
			revs[i] = o.Revision
			written[k] = began
		}
		cctx, cancel := context.WithCancel(ctx)
		churned := make(chan error, 1)
		go func() {
			defer close(churned)
			for i := 0; cctx.Err() == nil; i++ {
				for _, k := range churn(i) {
					if o, err := churner.Create(cctx, ks, k, []byte("x")); err == nil && o.Won {
						_, _ = churner.Delete(cctx, ks, k, o.Revision)
					}
				}
				j := i % len(stable)
				began := time.Now()
				o, err := churner.Update(cctx, ks, stable[j], []byte("y"), revs[j])
				if err == nil && !o.Won && ks == spate.Ephemeral { // expired: create it again
					began = time.Now()
					o, err = churner.Create(cctx, ks, stable[j], []byte("y"))
				}
				if err != nil && cctx.Err() == nil {
					churned <- err
					return
				}
				if o.Won {
					revs[j] = o.Revision
					mu.Lock()
					written[stable[j]] = began
					mu.Unlock()
				}
			}
		}()
		excused := 0
		for round := range 15 {
			mu.Lock()
			before := maps.Clone(written)
			mu.Unlock()
			wctx, wcancel := context.WithCancel(ctx)
			ch, err := watch(wctx, s, ks)
			require.NoError(t, err)
			have := snapshotOf(t, ch)
			done := time.Now()
			wcancel()
			if check != nil {
				check(t, ks, round, have)
			}
			for _, k := range stable {
				if ks == spate.Ephemeral && done.Sub(before[k]) >= storeTTL {
					excused++ // written a TTL or more before the snapshot ended: it may have expired
					continue
				}
				assert.Contains(t, have, k, "%v snapshot %d misses %q, live throughout (%d keys in it)", ks, round, k, len(have))
			}
		}
		cancel()
		require.NoError(t, <-churned, "churner")
		t.Logf("%v: %d of %d stable-key checks left out (the key's last write began a TTL or more before the snapshot ended)",
			ks, excused, 15*len(stable))
	}
}

// TestWatchCoalescesInOrder pins the driver's watch guarantee beyond the
// suite's WatchHasNoGaps: a watch opened while a writer is busy
// delivers each key's revisions in increasing order, every key the writer
// created, and each key's final revision; revisions superseded before
// delivery may be skipped.
func TestWatchCoalescesInOrder(t *testing.T) {
	t.Parallel()
	h := natsservers.NewHarness(t, ttl)
	ctx := testCtx(t, 60*time.Second)
	s, err := h.NewNATSStore(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	writer, err := h.NewNATSStore(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = writer.Close() })
	const n = 300
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		o, err := writer.Create(ctx, ks, "co.counter", []byte("0"))
		require.NoError(t, err)
		require.True(t, o.Won, "create co.counter")
		rev := o.Revision
		started := make(chan struct{})
		done := make(chan error, 1)
		final := map[string]uint64{}
		go func() {
			defer close(done)
			for i := 1; i <= n; i++ {
				if i == n/3 {
					close(started)
				}
				o, err := writer.Update(ctx, ks, "co.counter", []byte(fmt.Sprint(i)), rev)
				if err != nil || !o.Won {
					done <- fmt.Errorf("update %d: won=%t err=%v", i, o.Won, err)
					return
				}
				rev = o.Revision
				k := fmt.Sprintf("co.k%03d", i%50)
				if e, ok, err := writer.Get(ctx, ks, k); err != nil {
					done <- err
					return
				} else if ok {
					o, err = writer.Update(ctx, ks, k, []byte(fmt.Sprint(i)), e.Revision)
				} else {
					o, err = writer.Create(ctx, ks, k, []byte(fmt.Sprint(i)))
				}
				if err != nil || !o.Won {
					done <- fmt.Errorf("write %s: won=%t err=%v", k, o.Won, err)
					return
				}
				final[k] = o.Revision
			}
			final["co.counter"] = rev
		}()
		<-started
		wctx, wcancel := context.WithCancel(ctx)
		ch, err := s.Watch(wctx, ks, "co.")
		require.NoError(t, err)
		require.NoError(t, <-done)
		last := map[string]uint64{}
		reached := func() bool {
			for k, r := range final {
				if last[k] < r {
					return false
				}
			}
			return true
		}
		snapshot := true
		for !reached() {
			ev := recv(t, ch, "the writer's final revisions")
			switch ev.Kind {
			case spate.WatchSnapshotDone:
				require.True(t, snapshot, "rule: one SnapshotDone per watch")
				snapshot = false
			case spate.WatchPut:
				require.Greater(t, ev.Revision, last[ev.Key], "%v: %q revision %d after %d: a key's events arrive in increasing revision order", ks, ev.Key, ev.Revision, last[ev.Key])
				last[ev.Key] = ev.Revision
			default:
				require.FailNow(t, fmt.Sprintf("%v: unexpected %v %q %v", ks, ev.Kind, ev.Key, ev.Err))
			}
		}
		wcancel()
		for k, r := range final {
			assert.Equal(t, r, last[k], "%v: %q ends at %d, the writer's last revision is %d", ks, k, last[k], r)
		}
	}
}
