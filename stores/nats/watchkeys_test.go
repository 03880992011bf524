package nats_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// snapshotOf reads a watch's snapshot: its puts by key, up to SnapshotDone.
func snapshotOf(t *testing.T, ch <-chan spate.WatchEvent) map[string]uint64 {
	t.Helper()
	got := map[string]uint64{}
	for ev := recv(t, ch, "snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "snapshot") {
		require.Equal(t, spate.WatchPut, ev.Kind, "a snapshot holds puts only (err %v)", ev.Err)
		got[ev.Key] = ev.Revision
	}
	return got
}

// TestWatchKeysIsNative: the server itself filters a key watch. Its one
// consumer filters on the listed keys' exact subjects, and has delivered
// only their messages (2 in the snapshot, 1 live) although 600 messages of
// unlisted keys, some sharing a listed key's bytes, went into the stream.
func TestWatchKeysIsNative(t *testing.T) {
	t.Parallel()
	h := natsservers.NewHarness(t, ttl)
	ctx := testCtx(t, 30*time.Second)
	s, err := h.NewNATSStore(ctx)
	require.NoError(t, err)
	unlisted := func(round int) {
		for i := range 300 {
			k := fmt.Sprintf("nk.a%03d", i)
			if i%2 == 1 {
				k = fmt.Sprintf("nk.a.%03d", i)
			}
			_, err := s.Delete(ctx, spate.Durable, k, spate.AnyRevision)
			require.NoError(t, err, "round %d", round)
		}
	}
	unlisted(0)
	for _, k := range []string{"nk.a", "nk.b"} {
		o, err := s.Create(ctx, spate.Durable, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := s.WatchKeys(wctx, spate.Durable, []string{"nk.b", "nk.a"})
	require.NoError(t, err)
	assert.Len(t, snapshotOf(t, ch), 2)
	unlisted(1)
	o, err := s.Create(ctx, spate.Durable, "nk.c", []byte("unlisted"))
	require.NoError(t, err)
	require.True(t, o.Won)
	en, ok, err := s.Get(ctx, spate.Durable, "nk.a")
	require.NoError(t, err)
	require.True(t, ok)
	o, err = s.Update(ctx, spate.Durable, "nk.a", []byte("v2"), en.Revision)
	require.NoError(t, err)
	require.True(t, o.Won)
	ev := recv(t, ch, "the live put of nk.a")
	require.Equal(t, spate.WatchPut, ev.Kind)
	require.Equal(t, "nk.a", ev.Key)
	require.Equal(t, o.Revision, ev.Revision)

	nc, err := h.Conn()
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	durable, _ := spatenats.Buckets(h.Options().Job)
	st, err := js.Stream(ctx, "KV_"+durable)
	require.NoError(t, err)
	var infos []*jetstream.ConsumerInfo
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		infos = append(infos, ci)
	}
	require.NoError(t, lister.Err())
	require.Len(t, infos, 1, "one consumer per key watch")
	pre := "$KV." + durable + "."
	assert.Equal(t, []string{pre + "nk.a", pre + "nk.b"}, infos[0].Config.FilterSubjects)
	assert.Equal(t, uint64(3), infos[0].Delivered.Consumer,
		"the server delivered only the listed keys' messages (stream at %d)", infos[0].Delivered.Stream)
}

// TestWatchKeysSnapshotNeverUnderReports is TestWatchSnapshotNeverUnderReports
// for a key watch: while listed keys churn (rewritten, created and deleted)
// and unlisted ones too, the snapshot of every round holds every listed key
// that was live throughout, and no key that is not listed.
func TestWatchKeysSnapshotNeverUnderReports(t *testing.T) {
	// Not parallel, as TestWatchSnapshotNeverUnderReports.
	var stable, listed []string
	for i := range 40 {
		stable = append(stable, fmt.Sprintf("sk.stable.%02d", i))
	}
	listed = append(listed, stable...)
	for i := range 7 {
		listed = append(listed, fmt.Sprintf("sk.churn.%d", i))
	}
	snapshotsUnderChurn(t, stable, func(i int) []string {
		return []string{fmt.Sprintf("sk.churn.%d", i%7), fmt.Sprintf("sk.other.%d", i%5)}
	},
		func(ctx context.Context, s *spatenats.Store, ks spate.Keyspace) (<-chan spate.WatchEvent, error) {
			return s.WatchKeys(ctx, ks, listed)
		},
		func(t *testing.T, ks spate.Keyspace, round int, have map[string]uint64) {
			for k := range have {
				assert.True(t, slices.Contains(listed, k), "%v snapshot %d holds %q, not listed", ks, round, k)
			}
		})
}

// requireBreaksRetryable reads ch until it closes; its last event must be a
// Retryable WatchError of the key watch.
func requireBreaksRetryable(t *testing.T, ch <-chan spate.WatchEvent, ks spate.Keyspace, label string) {
	t.Helper()
	var last spate.WatchEvent
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				require.Equal(t, spate.WatchError, last.Kind, "a broken key watch ends with a WatchError")
				require.ErrorIs(t, last.Err, spate.ErrRetryable)
				require.Contains(t, last.Err.Error(), fmt.Sprintf("watch-keys %v %q", ks, label))
				t.Logf("broke with: %v", last.Err)
				return
			}
			last = ev
		case <-time.After(eventWait):
			t.Fatalf("the key watch did not end within %v (last event %v %q)", eventWait, last.Kind, last.Key)
		}
	}
}

// TestWatchKeysBreaksRetryable: a key watch breaks as a prefix watch does,
// with a Retryable WatchError as its last event, when its connection is
// closed, and when its reader falls more than 4096 events behind (unless
// the server coalesced the writes, and it converges).
func TestWatchKeysBreaksRetryable(t *testing.T) {
	t.Parallel()
	t.Run("lagging reader", func(t *testing.T) {
		h := natsservers.NewHarness(t, ttl)
		ctx := testCtx(t, 60*time.Second)
		s, err := h.NewNATSStore(ctx)
		require.NoError(t, err)
		ch, err := s.WatchKeys(ctx, spate.Durable, []string{"lag.k", "lag.j"})
		require.NoError(t, err)
		require.Empty(t, snapshotOf(t, ch))
		o, err := s.Create(ctx, spate.Durable, "lag.k", []byte("v"))
		require.NoError(t, err)
		for range 4500 {
			o, err = s.Update(ctx, spate.Durable, "lag.k", []byte("v"), o.Revision)
			require.NoError(t, err)
			require.True(t, o.Won)
		}
		// The pump may lag the writer (under -race it does), and then the
		// server coalesces the superseded revisions: the watch converges
		// instead of breaking, which the contract allows.
		for {
			ev := recv(t, ch, "the break, or the last revision of lag.k")
			if ev.Kind == spate.WatchError {
				require.ErrorIs(t, ev.Err, spate.ErrRetryable)
				require.Contains(t, ev.Err.Error(), `watch-keys durable "lag.j"`)
				t.Logf("broke with: %v", ev.Err)
				_, open := <-ch
				require.False(t, open, "a WatchError is the last event")
				return
			}
			require.Equal(t, "lag.k", ev.Key)
			if ev.Revision == o.Revision {
				t.Logf("converged: the server coalesced the writes the pump lagged behind")
				return
			}
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		h := natsservers.NewHarness(t, ttl)
		ctx := testCtx(t, 30*time.Second)
		nc, err := h.Conn()
		require.NoError(t, err)
		s := open(t, nc, spatenats.Options{Job: h.Options().Job, TTL: ttl})
		ch, err := s.WatchKeys(ctx, spate.Ephemeral, []string{"cc.k"})
		require.NoError(t, err)
		require.Empty(t, snapshotOf(t, ch))
		nc.Close()
		requireBreaksRetryable(t, ch, spate.Ephemeral, "cc.k")
	})
}

// TestWatchKeysOverMaxPayload: the consumer-create request of a key watch
// carries every listed subject. On a server whose max_payload is too small
// for them the watch fails at once with a Fatal error that says so, not
// as a value too large.
func TestWatchKeysOverMaxPayload(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithMaxPayload(64<<10))
	nc := srv.Connect(t)
	s := open(t, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl, MaxValueSize: 32 << 10})
	ctx := testCtx(t, 20*time.Second)
	keys := make([]string, spate.MaxWatchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("mp.%04d.%s", i, strings.Repeat("x", 200))
	}
	start := time.Now()
	_, err := s.WatchKeys(ctx, spate.Durable, keys)
	require.Error(t, err)
	assert.ErrorIs(t, err, spate.ErrFatal)
	assert.NotErrorIs(t, err, spate.ErrValueTooLarge)
	assert.Contains(t, err.Error(), "max_payload") // not the ctx's end, which is Retryable
	t.Logf("%v: %v", time.Since(start).Round(time.Millisecond), err)
	// Fewer keys fit.
	ch, err := s.WatchKeys(ctx, spate.Durable, keys[:64])
	require.NoError(t, err)
	assert.Empty(t, snapshotOf(t, ch))
}
