package pipeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestHealthState(t *testing.T) {
	now := time.Unix(0, 0)
	h := newHealthState(2, func() time.Time { return now })
	h.setSinksConnected(true)
	require.False(t, h.Ready(), "ready needs an assignment too")
	h.setAssignmentReceived()
	require.True(t, h.Ready(), "ready and live expected")
	require.True(t, h.Live(), "ready and live expected")
	now = now.Add(heartbeatStale + time.Second)
	h.beat(0)
	require.False(t, h.Live(), "a stale heartbeat must fail liveness")
	h.beat(1)
	h.reportWatermark(watermarkStuck+time.Second, false)
	require.True(t, h.Live(), "a stuck watermark counts only while data flows")
	h.reportWatermark(watermarkStuck+time.Second, true)
	require.False(t, h.Live(), "a stuck watermark with data flowing fails liveness")
}

// The backpressure controller against its rules: transitions alternate,
// a pause never ends before min_pause, above the low mark or with full
// queues, and once usage is low, the queues drain and min_pause passes
// without new rejections, it resumes.
func TestWatermarkControllerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		now := time.Unix(0, 0)
		p := newBPParams(1000, 0.8, 0.5, 10*time.Millisecond)
		w := newWatermarkController(p, func() time.Time { return now })
		last := bpResume
		var pausedAt time.Time
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(0, 5).Draw(t, "dt")) * time.Millisecond)
			if rapid.IntRange(0, 9).Draw(t, "reject") == 0 {
				w.onSendRejected()
				if w.paused {
					pausedAt = now
				}
			}
			usage := int64(rapid.IntRange(0, 1000).Draw(t, "usage"))
			low := rapid.Bool().Draw(t, "queuesLow")
			switch tr := w.tick(usage, low); tr {
			case bpPause, bpResume:
				require.NotEqual(t, last, tr, "transition %v twice in a row", tr)
				last = tr
				if tr == bpPause {
					pausedAt = now
				} else {
					require.LessOrEqual(t, usage, p.low, "resumed at usage %d queuesLow %v after %v", usage, low, now.Sub(pausedAt))
					require.True(t, low, "resumed at usage %d queuesLow %v after %v", usage, low, now.Sub(pausedAt))
					require.GreaterOrEqual(t, now.Sub(pausedAt), p.minPause, "resumed at usage %d queuesLow %v after %v", usage, low, now.Sub(pausedAt))
				}
			}
		}
		// Liveness: quiet conditions resume within min_pause.
		if w.paused {
			resumed := false
			for range 3 { // the first tick may only consume a pending rejection
				if w.tick(0, true) == bpResume {
					resumed = true
					break
				}
				now = now.Add(p.minPause)
			}
			require.True(t, resumed, "a paused controller must resume once pressure is gone")
		}
	})
}
