package nats_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestOpenProbeStoresNothing: New waits until each bucket's stream answers
// a publish through its server, by a probe the stream must refuse. Opening
// a job's store twice (the creator, then a worker adopting the buckets)
// leaves both streams empty and the probe's key absent.
func TestOpenProbeStoresNothing(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	opts := spatenats.Options{Job: job, TTL: 2 * time.Second}
	first := open(t, nc, opts)
	second := open(t, srv.Connect(t), opts)

	ctx := testCtx(t, 10*time.Second)
	js, streams := jobStreams(t, nc, job)
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		require.Zerof(t, st.CachedInfo().State.Msgs, "stream %s after two opens", name)
	}
	for _, s := range []spate.Store{first, second} {
		for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
			_, ok, err := s.Get(ctx, ks, "spate-ready-probe")
			require.NoError(t, err)
			require.Falsef(t, ok, "the probe's key is live in %s", ks)
		}
	}
	// The stores write at once.
	o, err := first.Create(ctx, spate.Durable, "spate-ready-probe", []byte("v"))
	require.NoError(t, err)
	require.True(t, o.Won)
}
