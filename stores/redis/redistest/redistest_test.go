package redistest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/redis"
	"github.com/spate-go/spate/stores/redis/redistest"
)

// The server and everything a harness opened are gone once the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ttl = 1500 * time.Millisecond

func TestAddrReachesTheServer(t *testing.T) {
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redis.New(ctx, c, redis.Options{Job: "redistest", TTL: ttl})
	require.NoError(t, err)
	defer s.Close()
	o, err := s.Create(ctx, spate.Durable, "k", []byte("v"))
	require.NoError(t, err)
	require.True(t, o.Won)
}

// A harness's stores share its job, a new harness has a fresh one, and
// Harness.Close releases every store and client the harness opened, even a
// store the caller left open: nothing the harness started outlives it.
func TestHarnessReleasesWhatItOpened(t *testing.T) {
	srv := redistest.Start(t)
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
	baseline := goleak.IgnoreCurrent()

	t.Run("second", func(t *testing.T) {
		h := mk(t)
		a, err := h.NewStore(ctx)
		require.NoError(t, err)
		b, err := h.NewStore(ctx)
		require.NoError(t, err)
		_, ok, err := a.Get(ctx, spate.Durable, "k")
		require.NoError(t, err)
		require.False(t, ok, "a new harness sees no key of an earlier one")

		o, err := a.Create(ctx, spate.Durable, "d", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		e, ok, err := b.Get(ctx, spate.Durable, "d")
		require.NoError(t, err)
		require.True(t, ok, "the stores of one harness share its job")
		require.Equal(t, "v", string(e.Value))

		require.NoError(t, a.Close())
		// b stays open: Harness.Close must close it and its client.
		require.NoError(t, h.Close())
		_, _, err = b.Get(ctx, spate.Durable, "d")
		require.ErrorIs(t, err, spate.ErrClosed)
	})
	goleak.VerifyNone(t, baseline)
}

// recordingTB records Fatalf and Skipf instead of ending the test; both
// then unwind Start with a panic, as the real ones end the goroutine.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

type stopped struct{}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recordingTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func startRecorded(t *testing.T) *recordingTB {
	r := &recordingTB{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(stopped); !ok {
					panic(p)
				}
			}
		}()
		redistest.Start(r)
	}()
	return r
}

// A missing redis-server fails the test under CI=true (a CI run must never
// pass by skipping the real server) and skips it, loudly, elsewhere.
func TestMissingServerFailsUnderCIAndSkipsElsewhere(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")

	t.Setenv("CI", "true")
	r := startRecorded(t)
	require.Contains(t, r.fatal, "CI=true")
	require.Contains(t, r.fatal, "redis-server not found")
	require.Empty(t, r.skip)

	t.Setenv("CI", "")
	r = startRecorded(t)
	require.Empty(t, r.fatal)
	require.Contains(t, r.skip, "redis-server not found")
}
