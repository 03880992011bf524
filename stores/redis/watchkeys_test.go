package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

// watchKeys opens a key watch and consumes its snapshot; cancel ends it.
func watchKeys(t *testing.T, st spate.Store, ks spate.Keyspace, keys ...string) (<-chan spate.WatchEvent, context.CancelFunc) {
	t.Helper()
	kw, ok := spate.KeyWatcherOf(st)
	require.True(t, ok, "the Redis store has the KeyWatcher capability")
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := kw.WatchKeys(ctx, ks, keys)
	require.NoError(t, err)
	for {
		ev := recv(t, ch, "the snapshot")
		if ev.Kind == spate.WatchSnapshotDone {
			return ch, cancel
		}
		require.Equal(t, spate.WatchPut, ev.Kind, "snapshot: %v", ev.Err)
	}
}

// shardChannels lists the job's shard channels someone subscribes to.
func shardChannels(t *testing.T, c *goredis.Client, job string) []string {
	t.Helper()
	chans, err := c.PubSubShardChannels(t.Context(), "spate:{"+job+"}:*").Result()
	require.NoError(t, err)
	slices.Sort(chans)
	return chans
}

// TestWatchKeysSubscribesOnlyItsKeys: a store whose watches are key
// watches holds the channels of their keys (and its anchor) only, never a
// keyspace's channel, so the server sends it no other key's change; two
// watches of one key share its channel; a key's channel is let go when its
// last watch ends, and a prefix watch holds its keyspace's channel while it
// is open.
func TestWatchKeysSubscribesOnlyItsKeys(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	admin := srv.Client(t)
	h := srv.NewHarness(t, time.Minute)
	st := open(t, h)
	p := "spate:{" + h.Job() + "}:"
	d := p + "d:log"

	chA, cancelA := watchKeys(t, st, spate.Durable, "a", "b")
	chB, _ := watchKeys(t, st, spate.Durable, "b")
	assert.Equal(t, []string{d + ":a", d + ":b", p + "hub"}, shardChannels(t, admin, h.Job()),
		"the key watches' channels and the anchor, no keyspace channel")
	n, err := admin.PubSubShardNumSub(t.Context(), d+":b").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n[d+":b"], "two watches of one key share one subscription")

	for i := range 20 {
		create(t, st, spate.Durable, fmt.Sprintf("c.%d", i), "unwatched")
	}
	ra := create(t, st, spate.Durable, "a", "1")
	ev := recv(t, chA, "a's create")
	assert.Equal(t, "a", ev.Key)
	assert.Equal(t, ra, ev.Revision)
	rb := create(t, st, spate.Durable, "b", "1")
	for _, ch := range []<-chan spate.WatchEvent{chA, chB} {
		ev := recv(t, ch, "b's create")
		assert.Equal(t, "b", ev.Key)
		assert.Equal(t, rb, ev.Revision)
	}

	cancelA()
	require.Eventually(t, func() bool {
		return slices.Equal(shardChannels(t, admin, h.Job()), []string{d + ":b", p + "hub"})
	}, 5*time.Second, 10*time.Millisecond, "a's channel is let go with its last watch: %v", shardChannels(t, admin, h.Job()))

	_, cancelP := watchPrefix(t, st, spate.Durable, "")
	assert.Contains(t, shardChannels(t, admin, h.Job()), d, "a prefix watch holds its keyspace's channel")
	cancelP()
	require.Eventually(t, func() bool {
		return !slices.Contains(shardChannels(t, admin, h.Job()), d)
	}, 5*time.Second, 10*time.Millisecond, "the keyspace channel is let go with its last prefix watch")

	// b's watch still hears b, on either keyspace channel state.
	rb = update(t, st, spate.Durable, "b", "2", rb)
	ev = recv(t, chB, "b's update")
	assert.Equal(t, rb, ev.Revision)
}

// watchPrefix is watch with a cancel.
func watchPrefix(t *testing.T, st spate.Store, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := st.Watch(ctx, ks, prefix)
	require.NoError(t, err)
	for ev := recv(t, ch, "the snapshot"); ev.Kind != spate.WatchSnapshotDone; ev = recv(t, ch, "the snapshot") {
		require.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
	}
	return ch, cancel
}

// TestWatchKeysEndsRetryableWhenTheSubscriberReconnects: a key watch has
// no log of its keys, so when the subscriber's connection breaks it ends
// with a Retryable error; a new key watch, once the subscriber is back,
// has the change made meanwhile in its snapshot and hears later ones.
func TestWatchKeysEndsRetryableWhenTheSubscriberReconnects(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	admin := srv.Client(t)
	st := open(t, srv.NewHarness(t, time.Minute))
	ch, _ := watchKeys(t, st, spate.Ephemeral, "k")
	r := create(t, st, spate.Ephemeral, "k", "1")
	require.Equal(t, r, recv(t, ch, "the create").Revision)

	require.NoError(t, admin.Do(t.Context(), "CLIENT", "KILL", "TYPE", "pubsub").Err())
	ev := recv(t, ch, "the error")
	require.Equal(t, spate.WatchError, ev.Kind)
	assert.True(t, spate.IsRetryable(ev.Err), "%v", ev.Err)
	assert.Contains(t, ev.Err.Error(), "watch-keys")
	r = update(t, st, spate.Ephemeral, "k", "2", r)

	kw, _ := spate.KeyWatcherOf(st)
	ch, err := kw.WatchKeys(t.Context(), spate.Ephemeral, []string{"k"})
	require.NoError(t, err)
	ev = recv(t, ch, "the snapshot")
	require.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
	assert.Equal(t, r, ev.Revision, "the change made while the watch was down is in the new snapshot")
	require.Equal(t, spate.WatchSnapshotDone, recv(t, ch, "SnapshotDone").Kind)
	start := time.Now()
	r = update(t, st, spate.Ephemeral, "k", "3", r)
	require.Equal(t, r, recv(t, ch, "the update").Revision)
	assert.Less(t, time.Since(start), pushWait, "pushed again")
}

// TestWatchKeysWithoutPushPermissionsReadsTheLog: without PushCommands
// (found at startup) or without +ssubscribe (found by the subscriber, while
// the key watch waits for its channels), a key watch reads the change log
// and still delivers only its keys.
func TestWatchKeysWithoutPushPermissionsReadsTheLog(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t,
		redisservers.WithUser("nopush", password, aclRules("~spate:*", redis.PushCommands...)...),
		redisservers.WithUser("nossubscribe", password, aclRules("~spate:*", "ssubscribe")...),
	)
	for _, user := range []string{"nopush", "nossubscribe"} {
		t.Run(user, func(t *testing.T) {
			h := srv.NewHarness(t, testTTL, login(user, password), redisservers.WithStoreOptions(func(o *redis.Options) {
				o.Logger = slog.New(slog.DiscardHandler)
			}))
			st := open(t, h)
			ch, _ := watchKeys(t, st, spate.Durable, "k.1")
			for i := range 3 {
				create(t, st, spate.Durable, fmt.Sprintf("k.%d.x", i), "unlisted")
			}
			rev := create(t, st, spate.Durable, "k.1", "v")
			ev := recv(t, ch, "the create, read from the log")
			require.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
			assert.Equal(t, "k.1", ev.Key)
			assert.Equal(t, rev, ev.Revision)
		})
	}
}

// TestWatchKeysLagIsRetryable: a key watch whose consumer falls more than
// its buffer behind cannot catch up from a log of its keys; it delivers
// what it had, in order, then ends with a Retryable error.
func TestWatchKeysLagIsRetryable(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	h := srv.NewHarness(t, testTTL, redisservers.WithStoreOptions(func(o *redis.Options) {
		o.ChangeLogLength = redis.MinChangeLogLength // also the buffer's length
	}))
	st := open(t, h)
	ch, _ := watchKeys(t, st, spate.Durable, "lag.k")
	rev := create(t, st, spate.Durable, "lag.k", "v")
	for range 3 * redis.MinChangeLogLength {
		rev = update(t, st, spate.Durable, "lag.k", "v", rev)
	}
	var last uint64
	for {
		ev := recv(t, ch, "events or the lag error")
		if ev.Kind == spate.WatchError {
			require.ErrorIs(t, ev.Err, spate.ErrRetryable)
			t.Logf("after %d in order: %v", last, ev.Err)
			break
		}
		require.Equal(t, spate.WatchPut, ev.Kind)
		require.Greater(t, ev.Revision, last, "in revision order")
		require.Less(t, ev.Revision, rev, "the watch fell behind before the last write")
		last = ev.Revision
	}
	_, ok := <-ch
	assert.False(t, ok, "the error is the last event")
}
