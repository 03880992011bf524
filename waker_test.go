package spate_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

func TestWakerCoalescesAndNeverBlocks(t *testing.T) {
	w := spate.NewWaker()
	for range 100 {
		w.Wake() // must not block even though nobody receives
	}
	received := func() bool {
		select {
		case <-w.C():
			return true
		default:
			return false
		}
	}
	require.True(t, received(), "a wake must be buffered")
	require.False(t, received(), "a burst must coalesce into one wakeup")
	inert := spate.InertWaker()
	inert.Wake()
	var zero spate.Waker
	zero.Wake()
	require.Nil(t, inert.C(), "an inert waker has no channel")
}
