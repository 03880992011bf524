package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/etcd"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
)

// The server and everything a harness opened are gone once the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClientConfigReachesTheServer(t *testing.T) {
	srv := etcdtest.Start(t)
	require.NotEmpty(t, srv.Endpoints())
	cli, err := clientv3.New(srv.ClientConfig())
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.New(ctx, cli, etcd.Options{Prefix: "/etcdtest/", TTL: 2 * time.Second})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Create(ctx, spate.Durable, "k", []byte("v"))
	require.NoError(t, err)
}

// A harness's stores share its prefix, a new harness has a fresh one, and
// Harness.Close releases every store and client the harness opened, even a
// store the caller left open: nothing the harness started outlives it.
func TestHarnessReleasesWhatItOpened(t *testing.T) {
	srv := etcdtest.Start(t)
	mk := srv.HarnessMaker(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The first harness also brings the server's lazily started goroutines
	// up, so the leak baseline below holds only the server's.
	t.Run("first", func(t *testing.T) {
		h := mk(t)
		a, err := h.NewStore(ctx)
		require.NoError(t, err)
		require.Equal(t, 2*time.Second, a.Capabilities().TTL)
		o, err := a.Create(ctx, spate.Ephemeral, "k", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		require.NoError(t, a.Close())
		require.NoError(t, h.Close())
	})
	baseline := goleak.IgnoreCurrent()

	t.Run("second", func(t *testing.T) {
		h := mk(t)
		a, err := h.NewStore(ctx)
		require.NoError(t, err)
		b, err := h.NewStore(ctx)
		require.NoError(t, err)
		_, ok, err := a.Get(ctx, spate.Ephemeral, "k")
		require.NoError(t, err)
		require.False(t, ok, "a new harness sees no key of an earlier one")

		o, err := a.Create(ctx, spate.Durable, "d", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		e, ok, err := b.Get(ctx, spate.Durable, "d")
		require.NoError(t, err)
		require.True(t, ok, "the stores of one harness share its prefix")
		require.Equal(t, "v", string(e.Value))

		require.NoError(t, a.Close())
		// b stays open: Harness.Close must close it and its client.
		require.NoError(t, h.Close())
		_, _, err = b.Get(ctx, spate.Durable, "d")
		require.ErrorIs(t, err, spate.ErrClosed)
	})
	goleak.VerifyNone(t, baseline)
}
