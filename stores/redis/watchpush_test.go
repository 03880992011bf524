package redis_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

// pushWait is well under the one-second safety read of an idle watch: an
// event that arrives within it was pushed, not polled.
const pushWait = 500 * time.Millisecond

// subscriberIDs lists the server's connections holding shard subscriptions.
func subscriberIDs(t *testing.T, c *goredis.Client) []string {
	t.Helper()
	list, err := c.ClientList(t.Context()).Result()
	require.NoError(t, err)
	var ids []string
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(line, " ssub=") && !strings.Contains(line, " ssub=0 ") {
			id, _, _ := strings.Cut(line, " ")
			ids = append(ids, id)
		}
	}
	return ids
}

func subscribers(t *testing.T, c *goredis.Client) int { return len(subscriberIDs(t, c)) }

// TestWatchesShareOneSubscriberAndNoPooledConnection: many watches on one
// store use one subscriber connection between them and none of the pool:
// with a pool of two connections, ten open watches still leave writes
// their connections, and every watch hears every write promptly, also
// after the subscriber has idled for longer than its ping interval. On a
// one-node cluster too, through a ClusterClient.
func TestWatchesShareOneSubscriberAndNoPooledConnection(t *testing.T) {
	t.Parallel()
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		testWatchesShareOneSubscriber(t, redisservers.Start(t))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		testWatchesShareOneSubscriber(t, redisservers.Start(t, redisservers.WithCluster()))
	})
}

func testWatchesShareOneSubscriber(t *testing.T, srv *redisservers.Server) {
	// A long TTL: the ephemeral keys must not expire during the idle pause.
	h := srv.NewHarness(t, time.Minute, redisservers.WithClientOptions(func(o *goredis.Options) {
		o.PoolSize = 2
		o.PoolTimeout = 200 * time.Millisecond
	}))
	st := open(t, h)
	var chans []<-chan spate.WatchEvent
	for i := range 10 {
		ks := spate.Durable
		if i%2 == 1 {
			ks = spate.Ephemeral
		}
		ch, _ := watch(t, st, ks, "")
		chans = append(chans, ch)
	}
	admin := srv.Client(t)
	require.Eventually(t, func() bool { return subscribers(t, admin) == 1 }, 5*time.Second, 10*time.Millisecond,
		"one subscriber connection per store")
	sub := subscriberIDs(t, admin)

	for i := range 20 {
		if i == 10 {
			time.Sleep(2500 * time.Millisecond) // idle past the subscriber's pings
		}
		ks := spate.Durable
		if i%2 == 1 {
			ks = spate.Ephemeral
		}
		start := time.Now()
		rev := create(t, st, ks, fmt.Sprintf("k.%02d", i), "v")
		for j, ch := range chans {
			if (j%2 == 1) != (ks == spate.Ephemeral) {
				continue
			}
			ev := recv(t, ch, "the create")
			require.Equal(t, spate.WatchPut, ev.Kind, "watch %d: %v", j, ev.Err)
			require.Equal(t, rev, ev.Revision)
		}
		assert.Less(t, time.Since(start), pushWait, "write %d reached its watches late (polled, not pushed?)", i)
	}
	require.Equal(t, sub, subscriberIDs(t, admin), "still the same one subscriber connection")
	require.NoError(t, st.Close())
	require.Eventually(t, func() bool { return subscribers(t, admin) == 0 }, 5*time.Second, 20*time.Millisecond,
		"Close ends the subscriber connection")
}

// TestWatchRecoversLostNotifications: the change log, not the
// notifications, is the source of truth. A change that is never announced
// (as an older client's write would be) and changes made while the
// subscriber connection is down all reach the watch, in revision order,
// with no gap.
func TestWatchRecoversLostNotifications(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	h := srv.NewHarness(t, testTTL)
	st := open(t, h)
	ch, _ := watch(t, st, spate.Durable, "")
	admin := srv.Client(t)
	var want uint64
	next := func(what string) {
		t.Helper()
		want++
		ev := recv(t, ch, what)
		require.Equal(t, spate.WatchPut, ev.Kind, "%s: %v", what, ev.Err)
		require.Equal(t, want, ev.Revision, what)
	}

	create(t, st, spate.Durable, "a", "1")
	next("a pushed change")

	// An unannounced change: minted and logged as the scripts do, but not
	// published. Only the watch's own read of the log can find it.
	p := "spate:{" + h.Job() + "}:d:"
	rev, err := admin.Incr(t.Context(), p+"seq").Result()
	require.NoError(t, err)
	require.NoError(t, admin.XAdd(t.Context(), &goredis.XAddArgs{
		Stream: p + "log", ID: fmt.Sprintf("%d-0", rev), Values: []any{"k", "silent", "o", "p", "v", "x"},
	}).Err())
	next("an unannounced change, read from the log")

	// A later announced change arrives with the silent one before it.
	_, err = admin.Incr(t.Context(), p+"seq").Result()
	require.NoError(t, err)
	require.NoError(t, admin.XAdd(t.Context(), &goredis.XAddArgs{
		Stream: p + "log", ID: fmt.Sprintf("%d-0", rev+1), Values: []any{"k", "silent2", "o", "d"},
	}).Err())
	create(t, st, spate.Durable, "b", "1")
	ev := recv(t, ch, "the unannounced delete")
	require.Equal(t, spate.WatchDelete, ev.Kind, ev.Err)
	require.Equal(t, uint64(rev+1), ev.Revision)
	want++
	next("the announced change after it")

	// Kill the subscriber connection, write while it is down, then write
	// again: every change arrives once, in order.
	require.NoError(t, admin.Do(t.Context(), "CLIENT", "KILL", "TYPE", "pubsub").Err())
	for i := range 5 {
		create(t, st, spate.Durable, fmt.Sprintf("c.%d", i), "1")
	}
	for i := range 5 {
		next(fmt.Sprintf("change %d around the subscriber's reconnect", i))
	}
	require.Eventually(t, func() bool { return subscribers(t, admin) == 1 }, 10*time.Second, 20*time.Millisecond,
		"the subscriber comes back")
	create(t, st, spate.Durable, "d", "1")
	next("a change after the reconnect")
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %v@%d %v", ev.Kind, ev.Revision, ev.Err)
	case <-time.After(100 * time.Millisecond):
	}
}

// lockedBuffer collects a store's log lines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWatchWithoutPushPermissionsReadsTheLog: an ACL user without
// PushCommands or the channel rule, as set up for an older version of the
// driver, still opens the store and writes; the store warns, and its
// watches hear of changes by reading the change log, within about two
// seconds.
func TestWatchWithoutPushPermissionsReadsTheLog(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t,
		redisservers.WithUser("nopush", password, aclRules("~spate:*", redis.PushCommands...)...),
		redisservers.WithUser("nochannels", password, append(aclRules("~spate:*"), "resetchannels")...),
		redisservers.WithUser("nossubscribe", password, aclRules("~spate:*", "ssubscribe")...),
	)
	admin := srv.Client(t)
	for _, user := range []string{"nopush", "nochannels", "nossubscribe"} {
		t.Run(user, func(t *testing.T) {
			var logs lockedBuffer
			h := srv.NewHarness(t, testTTL, login(user, password), redisservers.WithStoreOptions(func(o *redis.Options) {
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			}))
			st := open(t, h)
			ch, _ := watch(t, st, spate.Durable, "")
			for i := range 3 {
				rev := create(t, st, spate.Durable, fmt.Sprintf("k.%d", i), "v")
				start := time.Now()
				ev := recv(t, ch, "the create, read from the log")
				require.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
				require.Equal(t, rev, ev.Revision)
				assert.Less(t, time.Since(start), 3*time.Second)
			}
			require.Eventually(t, func() bool {
				return strings.Contains(logs.String(), "watches read the change log once a second")
			}, 5*time.Second, 20*time.Millisecond, "the store warns that its watches poll: %s", logs.String())
			assert.Zero(t, subscribers(t, admin), "no subscriber connection stays open")
		})
	}
}

// TestUpdateAndDeleteLogsAndPushesBothChanges: the release script mints,
// logs and publishes each change on its own keyspace, as Update and
// Delete do: each keyspace's watch is pushed its change (well within the
// one-second log read), and each change log's newest entry is that
// change, under its revision.
func TestUpdateAndDeleteLogsAndPushesBothChanges(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	admin := srv.Client(t)
	h := srv.NewHarness(t, testTTL)
	st := open(t, h)
	dch, _ := watch(t, st, spate.Durable, "")
	ech, _ := watch(t, st, spate.Ephemeral, "")
	rec := create(t, st, spate.Durable, "split.a", "owned")
	lease := create(t, st, spate.Ephemeral, "split.a", "lease")
	recv(t, dch, "the record's create")
	recv(t, ech, "the lease's create")

	r, ok := spate.ReleaserOf(st)
	require.True(t, ok, "the Redis store has the Releaser capability")
	start := time.Now()
	u, d, err := r.UpdateAndDelete(t.Context(), "split.a", []byte("released"), rec, "split.a", lease)
	require.NoError(t, err)
	require.True(t, u.Won && d.Won)
	ev := recv(t, dch, "the owner-clear")
	assert.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
	assert.Equal(t, u.Revision, ev.Revision)
	assert.Equal(t, "released", string(ev.Value))
	ev = recv(t, ech, "the lease delete")
	assert.Equal(t, spate.WatchDelete, ev.Kind, ev.Err)
	assert.Equal(t, d.Revision, ev.Revision)
	assert.Less(t, time.Since(start), pushWait, "both changes were pushed, not polled")

	for _, c := range []struct {
		space, op string
		rev       uint64
	}{{"d", "p", u.Revision}, {"e", "d", d.Revision}} {
		key := "spate:{" + h.Job() + "}:" + c.space + ":log"
		last, err := admin.XRevRangeN(t.Context(), key, "+", "-", 1).Result()
		require.NoError(t, err)
		require.Len(t, last, 1)
		assert.Equal(t, fmt.Sprintf("%d-0", c.rev), last[0].ID, "%s: the log entry's ID is the change's revision", key)
		assert.Equal(t, "split.a", last[0].Values["k"])
		assert.Equal(t, c.op, last[0].Values["o"])
	}
}

// TestIdleSubscriberKeepsPushingUnderTheDocumentedACL: an ACL user granted
// exactly what the package doc lists (no +ping) keeps its subscriber
// through idle periods: the subscriber's probe of an idle connection must
// not be a command the user lacks, or every watch would fall back to
// reading the log once a second.
func TestIdleSubscriberKeepsPushingUnderTheDocumentedACL(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithUser("spate", password, aclRules("~spate:*")...))
	var logs lockedBuffer
	h := srv.NewHarness(t, time.Minute, login("spate", password), redisservers.WithStoreOptions(func(o *redis.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}))
	st := open(t, h)
	ch, _ := watch(t, st, spate.Durable, "")
	time.Sleep(2500 * time.Millisecond) // idle past the subscriber's probes
	start := time.Now()
	rev := create(t, st, spate.Durable, "k", "v")
	ev := recv(t, ch, "the create")
	require.Equal(t, spate.WatchPut, ev.Kind, ev.Err)
	require.Equal(t, rev, ev.Revision)
	assert.Less(t, time.Since(start), pushWait, "the create was pushed, not polled")
	assert.NotContains(t, logs.String(), "may not subscribe")
	assert.NotContains(t, logs.String(), "lost its connection")
}
