package pipeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDrainBarrier(t *testing.T) {
	t.Run("completes when every party arrives", func(t *testing.T) {
		b := newDrainBarrier(2)
		b.Arrive()
		require.False(t, b.Wait(time.Millisecond), "barrier completed with a party missing")
		require.Equal(t, 1, b.Remaining(), "remaining = %d, want 1", b.Remaining())
		go b.Arrive()
		require.True(t, b.Wait(5*time.Second), "barrier did not complete after every party arrived")
		require.True(t, b.Wait(0), "waiting after completion must return true at once")
	})
	t.Run("zero parties is complete", func(t *testing.T) {
		require.True(t, newDrainBarrier(0).Wait(0), "a zero-party barrier must be complete")
	})
	t.Run("extra arrivals are ignored", func(t *testing.T) {
		b := newDrainBarrier(1)
		b.Arrive()
		b.Arrive()
		require.True(t, b.Done(), "barrier state broken by an extra arrival")
		require.Zero(t, b.Remaining(), "barrier state broken by an extra arrival")
	})
}
