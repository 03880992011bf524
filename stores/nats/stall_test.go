package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestStalledConsumerBreaksTheWatch: a watch whose consumer stops
// delivering while the connection, the server and the consumer's idle
// heartbeats are all fine (here: the consumer paused on the server, right
// after the watch's snapshot) delivers the change it withheld, or breaks
// with a Retryable error, within [spatenats.WatchStallBound] of the write.
// It never stays silent: a coordinator re-opens a broken watch, but it
// cannot tell a silent one from a quiet job. (The watch deletes the stalled
// consumer, and nats.go's re-created one is not paused: the change comes.)
//
// The fault is the one a 3-node R3 cluster produced in CI (a live event
// that never came within the conformance rule's bound, no error either),
// injected at the moment that matters: after the subscribe, before the
// write.
func TestStalledConsumerBreaksTheWatch(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	// The pause outlasts the test: an event that comes at all came from a
	// watch that noticed.
	pause := 10 * spatenats.WatchStallBound
	ctx := testCtx(t, pause)

	for _, tc := range []struct {
		name  string
		watch func(context.Context, *spatenats.Store) (<-chan spate.WatchEvent, error)
	}{
		{"watch", func(ctx context.Context, s *spatenats.Store) (<-chan spate.WatchEvent, error) {
			return s.Watch(ctx, spate.Durable, "st.")
		}},
		{"watch-keys", func(ctx context.Context, s *spatenats.Store) (<-chan spate.WatchEvent, error) {
			return s.WatchKeys(ctx, spate.Durable, []string{"st.keys"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A job (and so streams) of its own: the consumers an earlier
			// case's watches leave are deleted asynchronously, and would
			// be counted with this watch's.
			job := natsservers.NewJob()
			s := open(t, nc, spatenats.Options{Job: job, TTL: 2 * time.Second})
			js, streams := jobStreams(t, nc, job)
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ch, err := tc.watch(wctx, s)
			require.NoError(t, err)
			for ev := range ch {
				require.NotEqual(t, spate.WatchError, ev.Kind, "snapshot: %v", ev.Err)
				if ev.Kind == spate.WatchSnapshotDone {
					break
				}
			}
			st, err := js.Stream(ctx, streams[0])
			require.NoError(t, err)
			var names []string
			for n := range st.ConsumerNames(ctx).Name() {
				names = append(names, n)
			}
			require.Len(t, names, 1, "the watch's consumer")
			_, err = js.PauseConsumer(ctx, streams[0], names[0], time.Now().Add(pause))
			require.NoError(t, err, "pause the watch's consumer")

			key := "st." + tc.name
			if tc.name == "watch-keys" {
				key = "st.keys"
			}
			mustCreate(t, ctx, s, spate.Durable, key)
			written := time.Now()
			// Generous: the bound is the driver's promise on a healthy
			// machine; a loaded one may add its latency on top.
			limit := time.After(3 * spatenats.WatchStallBound)
			select {
			case ev, ok := <-ch:
				require.True(t, ok, "the watch ended without an error")
				if ev.Kind == spate.WatchPut {
					require.Equal(t, key, ev.Key)
					t.Logf("delivered %v after the write", time.Since(written).Round(time.Millisecond))
					break
				}
				require.Equal(t, spate.WatchError, ev.Kind, "event %+v", ev)
				require.True(t, errors.Is(ev.Err, spate.ErrRetryable), "a stalled watch breaks Retryable: %v", ev.Err)
				require.ErrorContains(t, ev.Err, "deliver", "the error says what stalled")
				t.Logf("broke %v after the write: %v", time.Since(written).Round(time.Millisecond), ev.Err)
			case <-limit:
				t.Fatalf("rule: a watch delivers every change or breaks Retryable; silent for %v after the write of %q",
					3*spatenats.WatchStallBound, key)
			}
			// A new watch (a new consumer) sees the change.
			ch2, err := tc.watch(wctx, s)
			require.NoError(t, err)
			seen := false
			for ev := range ch2 {
				require.NotEqual(t, spate.WatchError, ev.Kind, "re-opened watch: %v", ev.Err)
				seen = seen || ev.Key == key
				if ev.Kind == spate.WatchSnapshotDone {
					break
				}
			}
			require.True(t, seen, "the re-opened watch's snapshot has %q", key)
		})
	}
}
