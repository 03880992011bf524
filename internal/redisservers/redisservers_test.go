package redisservers_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate/internal/redisservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestartKeepsAddressAndData: a clean restart and a crash restart both
// come back on the same port with the AOF's data.
func TestRestartKeepsAddressAndData(t *testing.T) {
	srv := redisservers.Start(t, redisservers.WithAOF())
	addr := srv.Addr()
	c := srv.Client(t)
	ctx := t.Context()
	require.NoError(t, c.Set(ctx, "k", "v1", 0).Err())
	srv.Restart()
	require.Equal(t, addr, srv.Addr(), "restart moved the server")
	require.NoError(t, c.Set(ctx, "k2", "v2", 0).Err()) // go-redis redials
	srv.Kill()
	require.Error(t, c.Ping(ctx).Err(), "a killed server answered")
	srv.StartAgain()
	for k, want := range map[string]string{"k": "v1", "k2": "v2"} {
		got, err := c.Get(ctx, k).Result()
		assert.NoError(t, err, "after restarts get %q", k)
		assert.Equal(t, want, got, "after restarts %q", k)
	}
	assert.NotEmpty(t, srv.Log(), "the server's log tail is empty")
}
