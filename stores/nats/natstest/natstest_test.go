package natstest_test

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	spatenats "github.com/spate-go/spate/stores/nats"
	"github.com/spate-go/spate/stores/nats/natstest"
)

// The server and everything a harness opened are gone once the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ttl = 2 * time.Second

func TestURLReachesTheServer(t *testing.T) {
	srv := natstest.Start(t)
	nc, err := natsgo.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: "natstest", TTL: ttl})
	require.NoError(t, err)
	defer s.Close()
	o, err := s.Create(ctx, spate.Durable, "k", []byte("v"))
	require.NoError(t, err)
	require.True(t, o.Won)
}

// A harness's stores share its job, a new harness has a fresh one, and
// Harness.Close releases every store and connection the harness opened,
// even a store the caller left open.
func TestHarnessReleasesWhatItOpened(t *testing.T) {
	srv := natstest.Start(t)
	mk := srv.HarnessMaker(ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("first", func(t *testing.T) {
		h := mk(t)
		a, err := h.NewStore(ctx)
		require.NoError(t, err)
		require.Equal(t, ttl, a.Capabilities().TTL)
		o, err := a.Create(ctx, spate.Durable, "k", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		require.NoError(t, a.Close())
		require.NoError(t, h.Close())
	})

	t.Run("second", func(t *testing.T) {
		h := mk(t)
		a, err := h.NewStore(ctx)
		require.NoError(t, err)
		_, ok, err := a.Get(ctx, spate.Durable, "k")
		require.NoError(t, err)
		require.False(t, ok, "a new harness sees no key of an earlier one")
		// The job's buckets now exist on the server, with their own
		// goroutines, which outlive the harness as a server's would.
		baseline := goleak.IgnoreCurrent()

		b, err := h.NewStore(ctx)
		require.NoError(t, err)
		o, err := a.Create(ctx, spate.Durable, "d", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		e, ok, err := b.Get(ctx, spate.Durable, "d")
		require.NoError(t, err)
		require.True(t, ok, "the stores of one harness share its job")
		require.Equal(t, "v", string(e.Value))

		require.NoError(t, a.Close())
		// b stays open: Harness.Close must close it and its connection.
		require.NoError(t, h.Close())
		_, _, err = b.Get(ctx, spate.Durable, "d")
		require.ErrorIs(t, err, spate.ErrClosed)
		goleak.VerifyNone(t, baseline)
	})
}
