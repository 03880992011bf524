package pipeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWatermarkController(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	p := newBPParams(100, 0.8, 0.5, 10*time.Millisecond)
	require.Equal(t, int64(80), p.high, "params %+v", p)
	require.Equal(t, int64(50), p.low, "params %+v", p)
	w := newWatermarkController(p, clock)
	require.Equal(t, bpNone, w.tick(79, true), "paused below the high mark")
	require.Equal(t, bpPause, w.tick(80, true), "the high mark must pause")
	require.Equal(t, bpNone, w.tick(10, true), "resumed before min pause")
	now = now.Add(10 * time.Millisecond)
	require.Equal(t, bpNone, w.tick(51, true), "resumed above the low mark or with full queues")
	require.Equal(t, bpNone, w.tick(50, false), "resumed above the low mark or with full queues")
	w.onSendRejected()
	require.Equal(t, bpNone, w.tick(0, true), "a rejection while paused must hold the pause one tick")
	require.Equal(t, bpNone, w.tick(0, true), "a rejection while paused restarts the min-pause timer")
	now = now.Add(10 * time.Millisecond)
	require.Equal(t, bpResume, w.tick(0, true), "must resume once low, queues low and min pause passed")
	w.onSendRejected()
	require.Equal(t, bpPause, w.tick(0, true), "a rejection pauses on the next tick")
}

func TestInflightBudgetSaturates(t *testing.T) {
	b := newInflightBudget(10)
	b.Add(5)
	b.Sub(8)
	require.Zero(t, b.Usage(), "usage went below zero: %d", b.Usage())
}
