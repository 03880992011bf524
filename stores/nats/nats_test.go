package nats_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natstest"
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
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// jobStreams returns a JetStream handle on nc and the names of job's two
// streams by keyspace ([0] durable, [1] ephemeral), for tests that reach
// behind the driver.
func jobStreams(t *testing.T, nc *natsgo.Conn, job string) (jetstream.JetStream, [2]string) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	dname, ename := spatenats.Buckets(job)
	return js, [2]string{"KV_" + dname, "KV_" + ename}
}

// mustCreate creates key in ks and fails the test unless the write wins.
func mustCreate(t *testing.T, ctx context.Context, s spate.Store, ks spate.Keyspace, key string) {
	t.Helper()
	o, err := s.Create(ctx, ks, key, []byte("v"))
	if err != nil || !o.Won {
		t.Fatalf("create %v %q: won=%t err=%v", ks, key, o.Won, err)
	}
}

// roundTrip writes and reads one key in each keyspace.
func roundTrip(t *testing.T, s spate.Store) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		o, err := s.Create(ctx, ks, "rt.k", []byte("v"))
		if err != nil || !o.Won {
			t.Fatalf("%v create: won=%t err=%v", ks, o.Won, err)
		}
		e, ok, err := s.Get(ctx, ks, "rt.k")
		if err != nil || !ok || string(e.Value) != "v" || e.Revision != o.Revision {
			t.Fatalf("%v get: %+v ok=%t err=%v", ks, e, ok, err)
		}
	}
}

// requireFatal checks that err is Fatal (and not Retryable) and says each
// of says.
func requireFatal(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: want a Fatal error, got none", what)
	}
	if !spate.IsFatal(err) || errors.Is(err, spate.ErrRetryable) {
		t.Fatalf("%s: want Fatal, got %v", what, err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: the error should say %q: %v", what, s, err)
		}
	}
}

func requireRetryable(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !spate.IsRetryable(err) {
		t.Fatalf("%s: want Retryable, got %v", what, err)
	}
}

// TestAuthAndTLS connects with each kind of credentials and TLS, end to end,
// and requires bad credentials to be a clear Fatal error at startup, well
// before the dial's deadline.
func TestAuthAndTLS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []natstest.Option
		badSays string
	}{
		{"user-password", []natstest.Option{natstest.WithUserPassword("spate", "s3cret")}, "authentication failed"},
		{"token", []natstest.Option{natstest.WithToken("t0ken")}, "authentication failed"},
		{"nkey", []natstest.Option{natstest.WithNkey()}, "authentication failed"},
		{"creds", []natstest.Option{natstest.WithCreds()}, "authentication failed"},
		{"tls", []natstest.Option{natstest.WithTLS(false)}, ""},
		{"mutual-tls", []natstest.Option{natstest.WithTLS(true), natstest.WithUserPassword("spate", "pw")}, "authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, tc.opts...)
			nc, err := spatenats.Connect(testCtx(t, 10*time.Second), srv.URL, srv.ClientOptions...)
			if err != nil {
				t.Fatalf("connect with good credentials: %v", err)
			}
			t.Cleanup(nc.Close)
			s := open(t, nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
			roundTrip(t, s)

			if tc.badSays == "" {
				return
			}
			bad, err := srv.BadClientOptions()
			if err != nil {
				t.Fatalf("bad credentials: %v", err)
			}
			ctx := testCtx(t, 10*time.Second)
			nc2, err := spatenats.Connect(ctx, srv.URL, bad...)
			if nc2 != nil {
				nc2.Close()
			}
			if ctx.Err() != nil {
				t.Fatalf("bad credentials must fail at once, not at the dial's deadline: %v", err)
			}
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
	srv := natstest.Start(t, natstest.WithTLS(true))
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
	if ctx.Err() != nil {
		t.Fatalf("TLS failures must be immediate")
	}
}

// TestBadCredentialsOnRetryingConnection: a connection made with
// RetryOnFailedConnect never fails nats.Connect; nats.go closes it after the
// server rejected the credentials twice, and New must refuse it with a
// Fatal error that says why.
func TestBadCredentialsOnRetryingConnection(t *testing.T) {
	srv := natstest.Start(t, natstest.WithUserPassword("spate", "pw"))
	closed := make(chan struct{})
	nc, err := natsgo.Connect(srv.URL, natsgo.UserInfo("spate", "wrong"), natsgo.RetryOnFailedConnect(true),
		natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond),
		natsgo.ClosedHandler(func(*natsgo.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("RetryOnFailedConnect returns a connection: %v", err)
	}
	t.Cleanup(nc.Close)
	select {
	case <-closed:
	case <-testCtx(t, 10*time.Second).Done():
		t.Fatalf("nats.go never gave up on the rejected credentials")
	}
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
	requireFatal(t, "open over a connection whose credentials were rejected", err, "authentication failed")
}

func TestUnreachableServerIsRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, err = spatenats.Connect(testCtx(t, 10*time.Second), "nats://"+addr)
	requireRetryable(t, "connect to a closed port", err)
}

// TestServerLossIsRetryable: with the server gone, operations time out as
// Retryable errors and a store cannot be opened over the reconnecting
// connection (Retryable); over a connection closed by its owner, Fatal.
func TestServerLossIsRetryable(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	s := open(t, nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := s.Create(ctx, spate.Durable, "k", []byte("v"))
	requireRetryable(t, "create with the server down", err)
	_, err = spatenats.New(testCtx(t, 5*time.Second), nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
	requireRetryable(t, "open over a reconnecting connection", err)
	nc.Close()
	_, _, err = s.Get(testCtx(t, 5*time.Second), spate.Durable, "k")
	requireFatal(t, "get over a connection its owner closed", err, "closed")
	_, err = spatenats.New(testCtx(t, 5*time.Second), nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
	requireFatal(t, "open over a closed connection", err, "closed")
}

// TestExistingBucketWithOtherTTLIsFatal: a job's buckets fix the lease TTL;
// reopening with another is Fatal, names both buckets and says how to fix
// it. Other settings that cannot serve are Fatal too.
func TestExistingBucketWithOtherTTLIsFatal(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	job := natstest.NewJob()
	first := open(t, nc, spatenats.Options{Job: job, TTL: ttl})
	roundTrip(t, first)
	dname, ename := spatenats.Buckets(job)

	_, err := spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: job, TTL: 3 * time.Second})
	requireFatal(t, "reopen with another TTL", err, "lease duration cannot change mid-job", "finish the job or delete buckets", dname, ename)

	again := open(t, nc, spatenats.Options{Job: job, TTL: ttl})
	if e, ok, err := again.Get(testCtx(t, 5*time.Second), spate.Durable, "rt.k"); err != nil || !ok || string(e.Value) != "v" {
		t.Fatalf("reopening with the same settings adopts the buckets and their data; got %+v %t %v", e, ok, err)
	}

	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: job, TTL: ttl, Storage: jetstream.MemoryStorage})
	requireFatal(t, "reopen with another storage", err, "storage", dname)

	// A bucket made with the plain KV API has direct get on.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kvJob := natstest.NewJob()
	kd, _ := spatenats.Buckets(kvJob)
	if _, err := js.CreateKeyValue(testCtx(t, 5*time.Second), jetstream.KeyValueConfig{Bucket: kd}); err != nil {
		t.Fatal(err)
	}
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: kvJob, TTL: ttl})
	requireFatal(t, "adopt a KV bucket with direct get", err, "direct get")

	// R3 on a single server: the server refuses the configuration.
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl, Replicas: 3})
	requireFatal(t, "R3 on a server without a cluster", err)
}

// TestOldServerIsFatal: a real server behind a proxy that reports version
// 2.10.22 in its INFO is refused with an error that says to upgrade.
func TestOldServerIsFatal(t *testing.T) {
	srv := natstest.Start(t)
	target := strings.TrimPrefix(srv.URL, "nats://")
	proxy := natstest.VersionProxy(t, target, "2.10.22")
	nc, err := natsgo.Connect(proxy)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(nc.Close)
	if v := nc.ConnectedServerVersion(); v != "2.10.22" {
		t.Fatalf("the proxy should report 2.10.22, the client saw %q", v)
	}
	_, err = spatenats.New(testCtx(t, 10*time.Second), nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
	requireFatal(t, "open on a 2.10 server", err, "2.10.22", "2.11", "upgrade")

	// The same proxy reporting the real version works end to end.
	proxy = natstest.VersionProxy(t, target, srv.Version())
	nc2, err := natsgo.Connect(proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc2.Close)
	roundTrip(t, open(t, nc2, spatenats.Options{Job: natstest.NewJob(), TTL: ttl}))
}

func recv(t *testing.T, ch <-chan spate.WatchEvent, what string) spate.WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed while waiting for %s", what)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no watch event within 10s while waiting for %s", what)
	}
	return spate.WatchEvent{}
}

// TestWatchEmptyBucket: a watch of a bucket that never held a message, and
// of one that holds only delete markers, gets SnapshotDone at once.
func TestWatchEmptyBucket(t *testing.T) {
	h := natstest.NewHarness(t, ttl)
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 20*time.Second)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, err := s.Watch(ctx, ks, "")
		if err != nil {
			t.Fatal(err)
		}
		if ev := recv(t, ch, "SnapshotDone on an empty bucket"); ev.Kind != spate.WatchSnapshotDone {
			t.Fatalf("%v: an empty bucket's watch starts with SnapshotDone; got %v %q", ks, ev.Kind, ev.Key)
		}
	}
	for i := range 3 {
		k := fmt.Sprintf("gone.%d", i)
		o, err := s.Create(ctx, spate.Durable, k, []byte("v"))
		if err != nil || !o.Won {
			t.Fatal(err)
		}
		if d, err := s.Delete(ctx, spate.Durable, k, o.Revision); err != nil || !d.Won {
			t.Fatal(err)
		}
	}
	ch, err := s.Watch(ctx, spate.Durable, "gone.")
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, ch, "SnapshotDone over markers only"); ev.Kind != spate.WatchSnapshotDone {
		t.Fatalf("a bucket of delete markers has an empty snapshot; got %v %q", ev.Kind, ev.Key)
	}
}

// TestPrefixMidSegment: spate prefixes may end inside a key segment; the
// driver matches "has this string prefix" exactly, in List and Watch.
func TestPrefixMidSegment(t *testing.T) {
	h := natstest.NewHarness(t, ttl)
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 20*time.Second)
	for _, k := range []string{"spl", "split.1", "split.2.x", "splat", "sp", "sp.l", "other.spl", "s"} {
		if o, err := s.Create(ctx, spate.Durable, k, []byte(k)); err != nil || !o.Won {
			t.Fatalf("create %q: %v", k, err)
		}
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
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range list {
			got = append(got, e.Key)
		}
		if !slices.Equal(got, want) {
			t.Errorf("list %q = %v, want %v", prefix, got, want)
		}
		ch, err := s.Watch(ctx, spate.Durable, prefix)
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
			got = append(got, ev.Key)
		}
		if !slices.Equal(got, want) {
			t.Errorf("watch %q snapshot = %v, want %v", prefix, got, want)
		}
	}
	// Live events obey the same rule.
	ch, err := s.Watch(ctx, spate.Durable, "spl")
	if err != nil {
		t.Fatal(err)
	}
	for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
	}
	for _, k := range []string{"sp.x", "sq", "splx", "s.spl", "spl.y"} {
		if _, err := s.Create(ctx, spate.Durable, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"splx", "spl.y"} {
		if ev := recv(t, ch, want); ev.Key != want {
			t.Errorf("live event for prefix %q: got %q, want %q", "spl", ev.Key, want)
		}
	}
}

// TestLeaseExpiryLatency measures how long after its TTL an untouched
// lease's expiry reaches a watcher, on one server and on an R3 cluster, and
// requires that it never arrives before the TTL. Run with -v to see the
// numbers.
func TestLeaseExpiryLatency(t *testing.T) {
	t.Run("R1", func(t *testing.T) {
		t.Parallel()
		measureExpiry(t, natstest.NewHarness(t, ttl))
	})
	t.Run("R3", func(t *testing.T) {
		t.Parallel()
		c := natstest.StartCluster(t, 3, natstest.WithSyncAlways())
		measureExpiry(t, c.Harness(t, spatenats.Options{TTL: ttl, Replicas: 3}))
	})
}

func measureExpiry(t *testing.T, h *natstest.Harness) {
	s, err := h.NewNATSStore(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := testCtx(t, 60*time.Second)
	ch, err := s.Watch(ctx, spate.Ephemeral, "lat.")
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, ch, "SnapshotDone"); ev.Kind != spate.WatchSnapshotDone {
		t.Fatalf("got %v", ev.Kind)
	}
	const n = 8
	written := map[string]time.Time{}
	for i := range n {
		k := fmt.Sprintf("lat.%d", i)
		before := time.Now()
		if o, err := s.Create(ctx, spate.Ephemeral, k, []byte("v")); err != nil || !o.Won {
			t.Fatal(err)
		}
		written[k] = before
		if ev := recv(t, ch, "put of "+k); ev.Kind != spate.WatchPut || ev.Key != k {
			t.Fatalf("got %v %q", ev.Kind, ev.Key)
		}
		// Stagger the writes across the one-second marker precision.
		time.Sleep(time.Second / n)
	}
	var lat []time.Duration
	for len(lat) < n {
		ev := recv(t, ch, "an expiry")
		if ev.Kind != spate.WatchDelete {
			t.Fatalf("only expiries are due; got %v %q", ev.Kind, ev.Key)
		}
		late := time.Since(written[ev.Key]) - ttl
		if late < 0 {
			t.Errorf("rule: a lease lives at least its TTL; %q expired %v early", ev.Key, -late)
		}
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
	h := natstest.NewHarness(t, ttl)
	ctx := testCtx(t, 60*time.Second)
	s, err := h.NewNATSStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	churner, err := h.NewNATSStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = churner.Close() })
	const stable = 40
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		revs := make([]uint64, stable)
		for i := range stable {
			o, err := s.Create(ctx, ks, fmt.Sprintf("su.stable.%02d", i), []byte("v"))
			if err != nil || !o.Won {
				t.Fatal(err)
			}
			revs[i] = o.Revision
		}
		cctx, cancel := context.WithCancel(ctx)
		churned := make(chan error, 1)
		go func() {
			defer close(churned)
			for i := 0; cctx.Err() == nil; i++ {
				k := fmt.Sprintf("su.churn.%d", i%7)
				if o, err := churner.Create(cctx, ks, k, []byte("x")); err == nil && o.Won {
					_, _ = churner.Delete(cctx, ks, k, o.Revision)
				}
				j := i % stable
				o, err := churner.Update(cctx, ks, fmt.Sprintf("su.stable.%02d", j), []byte("y"), revs[j])
				if err != nil && cctx.Err() == nil {
					churned <- err
					return
				}
				if o.Won {
					revs[j] = o.Revision
				}
			}
		}()
		for round := range 15 {
			wctx, wcancel := context.WithCancel(ctx)
			ch, err := s.Watch(wctx, ks, "su.")
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]bool{}
			for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
				if ev.Kind != spate.WatchPut {
					t.Fatalf("a snapshot holds puts only; got %v %v", ev.Kind, ev.Err)
				}
				have[ev.Key] = true
			}
			wcancel()
			for i := range stable {
				if k := fmt.Sprintf("su.stable.%02d", i); !have[k] {
					t.Errorf("%v snapshot %d misses %q, live throughout (%d keys in it)", ks, round, k, len(have))
				}
			}
		}
		cancel()
		if err := <-churned; err != nil {
			t.Fatalf("churner: %v", err)
		}
	}
}

// TestWatchCoalescesInOrder pins the driver's watch guarantee beyond the
// suite's WatchHasNoGaps: a watch opened while a writer is busy
// delivers each key's revisions in increasing order, every key the writer
// created, and each key's final revision; revisions superseded before
// delivery may be skipped.
func TestWatchCoalescesInOrder(t *testing.T) {
	h := natstest.NewHarness(t, ttl)
	ctx := testCtx(t, 60*time.Second)
	s, err := h.NewNATSStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	writer, err := h.NewNATSStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writer.Close() })
	const n = 300
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		o, err := writer.Create(ctx, ks, "co.counter", []byte("0"))
		if err != nil || !o.Won {
			t.Fatal(err)
		}
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
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
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
				if !snapshot {
					t.Fatalf("rule: one SnapshotDone per watch")
				}
				snapshot = false
			case spate.WatchPut:
				if ev.Revision <= last[ev.Key] {
					t.Fatalf("%v: %q revision %d after %d: a key's events arrive in increasing revision order", ks, ev.Key, ev.Revision, last[ev.Key])
				}
				last[ev.Key] = ev.Revision
			default:
				t.Fatalf("%v: unexpected %v %q %v", ks, ev.Kind, ev.Key, ev.Err)
			}
		}
		wcancel()
		for k, r := range final {
			if last[k] != r {
				t.Errorf("%v: %q ends at %d, the writer's last revision is %d", ks, k, last[k], r)
			}
		}
	}
}
