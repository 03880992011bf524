package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestEndedWatchDeletesItsConsumer: a watch or key watch that ends leaves
// no consumer on the server. nats.go's iterator, once stopped, leaves its
// consumer to the inactive threshold (a minute); a fleet re-opening its
// key watches every reconcile interval would pile them up.
func TestEndedWatchDeletesItsConsumer(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	s := open(t, nc, spatenats.Options{Job: job, TTL: 2 * time.Second})
	ctx := testCtx(t, 20*time.Second)
	mustCreate(t, ctx, s, spate.Durable, "dc.k")

	js, streams := jobStreams(t, nc, job)
	consumers := func() int {
		st, err := js.Stream(ctx, streams[0])
		require.NoError(t, err)
		return st.CachedInfo().State.Consumers
	}
	require.Zero(t, consumers())

	for _, tc := range []struct {
		name  string
		watch func(context.Context) (<-chan spate.WatchEvent, error)
	}{
		{"watch", func(ctx context.Context) (<-chan spate.WatchEvent, error) { return s.Watch(ctx, spate.Durable, "dc.") }},
		{"watch-keys", func(ctx context.Context) (<-chan spate.WatchEvent, error) {
			return s.WatchKeys(ctx, spate.Durable, []string{"dc.j", "dc.k"})
		}},
	} {
		wctx, cancel := context.WithCancel(ctx)
		ch, err := tc.watch(wctx)
		require.NoError(t, err, tc.name)
		for ev := range ch {
			require.NotEqual(t, spate.WatchError, ev.Kind, "%s: %v", tc.name, ev.Err)
			if ev.Kind == spate.WatchSnapshotDone {
				break
			}
		}
		require.Equal(t, 1, consumers(), "%s: an open watch has its consumer", tc.name)
		cancel()
		for range ch {
		}
		require.Eventually(t, func() bool { return consumers() == 0 }, 5*time.Second, 20*time.Millisecond,
			"%s: the ended watch's consumer is still on the server", tc.name)
	}
}
