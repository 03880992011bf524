package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/testcerts"
	"github.com/spate-go/spate/stores/etcd"
)

// startupTimeout is the startup check bound the negative tests use.
const startupTimeout = 3 * time.Second

// newBounded runs etcd.New and fails t if it does not return within the
// startup timeout plus the diagnosis budget: a misconfigured client must
// never hang.
func newBounded(t *testing.T, cli *clientv3.Client, opts etcd.Options) (*etcd.Store, error, time.Duration) {
	t.Helper()
	type result struct {
		s   *etcd.Store
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		s, err := etcd.New(context.Background(), cli, opts)
		done <- result{s, err}
	}()
	limit := opts.StartupTimeout + 5*time.Second
	select {
	case r := <-done:
		if r.s != nil {
			t.Cleanup(func() { _ = r.s.Close() })
		}
		return r.s, r.err, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("etcd.New did not return within %v: a bad configuration must fail, not hang", limit)
	}
	return nil, nil, 0
}

func opts(prefix string) etcd.Options {
	return etcd.Options{Prefix: prefix, TTL: testTTL, StartupTimeout: startupTimeout}
}

// exercise runs every primitive once through s and checks the answers.
func exercise(t *testing.T, s spate.Store) {
	t.Helper()
	ctx := t.Context()
	ch, err := s.Watch(ctx, spate.Durable, "e2e.")
	require.NoError(t, err)
	require.Equal(t, spate.WatchSnapshotDone, (<-ch).Kind)
	c, err := s.Create(ctx, spate.Durable, "e2e.k", []byte("v1"))
	require.NoError(t, err)
	require.True(t, c.Won)
	u, err := s.Update(ctx, spate.Durable, "e2e.k", []byte("v2"), c.Revision)
	require.NoError(t, err)
	require.True(t, u.Won)
	en, ok, err := s.Get(ctx, spate.Durable, "e2e.k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v2", string(en.Value))
	e, err := s.Create(ctx, spate.Ephemeral, "e2e.lease", []byte("x"))
	require.NoError(t, err)
	require.True(t, e.Won)
	list, err := s.List(ctx, spate.Ephemeral, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	for _, want := range []uint64{c.Revision, u.Revision} {
		ev := <-ch
		require.Equal(t, spate.WatchPut, ev.Kind)
		require.Equal(t, want, ev.Revision)
	}
	d, err := s.Delete(ctx, spate.Durable, "e2e.k", u.Revision)
	require.NoError(t, err)
	require.True(t, d.Won)
	ev := <-ch
	require.Equal(t, spate.WatchDelete, ev.Kind)
	require.Equal(t, d.Revision, ev.Revision)
}

func requireFatal(t *testing.T, err error, mentions ...string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.Is(err, spate.ErrFatal), "want a Fatal error, got %v", err)
	require.True(t, spate.IsFatal(err), "error %v", err)
	for _, m := range mentions {
		require.Contains(t, err.Error(), m, "the error must name the problem")
	}
	t.Logf("error (as an operator sees it): %v", err)
}

func requireRetryable(t *testing.T, err error, mentions ...string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.Is(err, spate.ErrRetryable), "want a Retryable error, got %v", err)
	require.True(t, spate.IsRetryable(err), "error %v", err)
	for _, m := range mentions {
		require.Contains(t, err.Error(), m)
	}
	t.Logf("error: %v", err)
}

func TestTLSClientCertificates(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{TLS: true})
	rogue := testcerts.NewCA(t, "rogue")
	rogueClient, err := rogue.Client(etcdservers.JobUser)
	require.NoError(t, err)

	t.Run("EndToEnd", func(t *testing.T) {
		cli := c.Client(t, nil)
		s, err, _ := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		require.NoError(t, err)
		exercise(t, s)
	})

	bad := []struct {
		name string
		tls  func(*tls.Config)
	}{
		{"ClientDoesNotTrustServer", func(cfg *tls.Config) { cfg.RootCAs = rogue.Pool() }},
		{"ServerDoesNotTrustClientCert", func(cfg *tls.Config) { cfg.Certificates = []tls.Certificate{rogueClient.TLS} }},
		{"NoClientCert", func(cfg *tls.Config) { cfg.Certificates = nil }},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cli := c.Client(t, func(cfg *clientv3.Config) { tc.tls(cfg.TLS) })
			_, err, took := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
			requireFatal(t, err, "TLS", "certificate")
			t.Logf("New failed after %v", took.Round(time.Millisecond))
		})
	}
	t.Run("PlaintextClientToTLSServer", func(t *testing.T) {
		t.Parallel()
		cli := c.Client(t, func(cfg *clientv3.Config) {
			cfg.TLS = nil
			for i, ep := range cfg.Endpoints {
				cfg.Endpoints[i] = strings.Replace(ep, "https://", "http://", 1)
			}
		})
		_, err, _ := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		requireFatal(t, err, "TLS")
	})
}

func TestPasswordAuth(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{Auth: true})
	root, err := c.RootClient()
	require.NoError(t, err)
	t.Cleanup(func() { _ = root.Close() })

	t.Run("EndToEnd", func(t *testing.T) {
		cli := c.Client(t, nil)
		s, err, _ := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		require.NoError(t, err)
		exercise(t, s)
	})

	t.Run("WrongPasswordAtClientCreation", func(t *testing.T) {
		// clientv3.New authenticates itself when given a user and password,
		// so a wrong password never reaches etcd.New; its error is etcd's
		// typed ErrAuthFailed.
		cfg := c.ClientConfig()
		cfg.Password = "wrong"
		_, err := clientv3.New(cfg)
		require.Error(t, err)
		require.ErrorContains(t, err, "authentication failed")
	})

	t.Run("PasswordRotatedUnderTheClient", func(t *testing.T) {
		// A client built with a password that has since changed: its token
		// is invalidated and renewing it fails. New must say so, Fatal.
		ctx := t.Context()
		_, err := root.UserAdd(ctx, "rotated", "old-password")
		require.NoError(t, err)
		_, err = root.UserGrantRole(ctx, "rotated", etcdservers.JobRole)
		require.NoError(t, err)
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Username, cfg.Password = "rotated", "old-password" })
		_, err = root.UserChangePassword(ctx, "rotated", "new-password")
		require.NoError(t, err)
		_, err, took := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		requireFatal(t, err, "password")
		t.Logf("New failed after %v", took.Round(time.Millisecond))
	})

	t.Run("ReadOnlyUser", func(t *testing.T) {
		ctx := t.Context()
		prefix := etcdservers.FreshPrefix()
		_, err := root.RoleAdd(ctx, "reader")
		require.NoError(t, err)
		_, err = root.RoleGrantPermission(ctx, "reader", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermRead))
		require.NoError(t, err)
		_, err = root.UserAdd(ctx, "reader", "reader-password")
		require.NoError(t, err)
		_, err = root.UserGrantRole(ctx, "reader", "reader")
		require.NoError(t, err)
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Username, cfg.Password = "reader", "reader-password" })
		_, err, _ = newBounded(t, cli, opts(prefix))
		requireFatal(t, err, "permission denied", "readwrite")
	})

	t.Run("NoCredentials", func(t *testing.T) {
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Username, cfg.Password = "", "" })
		_, err, _ := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		requireFatal(t, err, "user")
	})
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	t.Run("AtStartup", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there now
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + addr}, DialTimeout: time.Second, Logger: nopLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = cli.Close() })
		_, err, took := newBounded(t, cli, opts(etcdservers.FreshPrefix()))
		requireRetryable(t, err, "accepts connections")
		t.Logf("New failed after %v (startup timeout %v)", took.Round(time.Millisecond), startupTimeout)
	})
	t.Run("AfterTheServerDied", func(t *testing.T) {
		t.Parallel()
		c := etcdservers.Start(t, etcdservers.Options{})
		s, err, _ := newBounded(t, c.Client(t, nil), opts(etcdservers.FreshPrefix()))
		require.NoError(t, err)
		c.Kill(0)
		const deadline = time.Second
		for _, op := range []struct {
			name string
			do   func(context.Context) error
		}{
			{"get", func(ctx context.Context) error { _, _, err := s.Get(ctx, spate.Durable, "k"); return err }},
			{"create", func(ctx context.Context) error { _, err := s.Create(ctx, spate.Ephemeral, "k", nil); return err }},
			{"update", func(ctx context.Context) error { _, err := s.Update(ctx, spate.Durable, "k", nil, 7); return err }},
			{"delete", func(ctx context.Context) error { _, err := s.Delete(ctx, spate.Durable, "k", 0); return err }},
			{"list", func(ctx context.Context) error { _, err := s.List(ctx, spate.Durable, ""); return err }},
			{"watch", func(ctx context.Context) error { _, err := s.Watch(ctx, spate.Durable, ""); return err }},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			start := time.Now()
			err := op.do(ctx)
			took := time.Since(start)
			cancel()
			requireRetryable(t, err)
			require.Less(t, took, deadline+2*time.Second, "%s must give up at its deadline", op.name)
		}
	})
}
