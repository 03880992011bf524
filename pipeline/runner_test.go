package pipeline

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blockingChain reports a full queue for its first blocks pushes, then
// takes the batch. It cannot wait for room.
type blockingChain struct {
	blocks, pushes, waits int
}

func (c *blockingChain) PushBatch(b *Batch, from int) pushOutcome {
	c.pushes++
	if c.pushes <= c.blocks {
		return pushOutcome{Kind: pushBlocked, ResumeAt: from, Reason: blockCapacity}
	}
	return pushOutcome{Kind: pushDone}
}

func (c *blockingChain) Flush() pushOutcome { return pushOutcome{Kind: pushDone} }
func (c *blockingChain) AbandonBatch()      {}
func (c *blockingChain) Close()             {}

// roomChain is a blockingChain that can wait for room (a roomWaiter). Its
// queue takes the parked chunk on every wait, unless full is set: then
// every wait lasts full and the queue stays full.
type roomChain struct {
	blockingChain
	full time.Duration
}

func (c *roomChain) waitRoom(time.Duration) bool {
	c.waits++
	if c.full > 0 {
		time.Sleep(c.full)
		return false
	}
	return true
}

func newTestRunner(t *testing.T, chain runnerChain, grace time.Duration) *runner {
	t.Helper()
	m, err := newMetrics("runner-test", nil)
	require.NoError(t, err)
	cfg := Config{Name: "runner-test", BlockGrace: grace, BlockedRetry: time.Microsecond}.WithDefaults()
	return &runner{
		cfg: &cfg, ctl: newMPSC[controlMsg](), events: newMPSC[runnerEvent](), chain: chain,
		bp:     newWatermarkController(newBPParams(1<<20, cfg.HighRatio, cfg.LowRatio, cfg.MinPause), nil),
		budget: newInflightBudget(1 << 20), queuesBelow: func(float64) bool { return true },
		health: newHealthState(1, nil), shutdown: new(atomic.Bool), m: m.forRunner(0),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), component: "runner-0", gates: map[PartitionID]*gateState{},
	}
}

func testBatch(t *testing.T) *Batch {
	t.Helper()
	cp := NewCheckpointer(nil)
	require.NoError(t, cp.BeginEpoch([]PartitionID{0}, 1))
	return &Batch{Payloads: make([]RawPayload, 3), Ack: cp.Issuer().Issue(0, 2)}
}

func pauses(rn *runner) int {
	n := 0
	for _, ev := range rn.events.DrainInto(nil) {
		if ev.kind == evPause {
			n++
		}
	}
	return n
}

// A batch that waits on a full queue inside the grace, and gets in once the
// queue takes the parked chunk, pauses nothing: the runner waited for room
// (polling nothing meanwhile) instead of pausing the source.
func TestBlockedBatchWithinGraceDoesNotPause(t *testing.T) {
	chain := &roomChain{blockingChain: blockingChain{blocks: 3}}
	rn := newTestRunner(t, chain, time.Hour)
	b := testBatch(t)
	require.Nil(t, rn.runBatch(b))
	require.Equal(t, 4, chain.pushes)
	require.Equal(t, 3, chain.waits, "every refusal waits for room")
	require.Zero(t, pauses(rn))
	require.False(t, rn.bp.paused)
	require.False(t, b.Ack.Failed())
}

// A queue that stays full past the grace is backpressure: the source is
// paused (once), and the batch still gets in when the queue frees.
func TestBlockedBatchPastGracePauses(t *testing.T) {
	chain := &roomChain{blockingChain: blockingChain{blocks: 3}, full: 2 * time.Millisecond}
	rn := newTestRunner(t, chain, time.Millisecond)
	b := testBatch(t)
	require.Nil(t, rn.runBatch(b))
	require.Equal(t, 4, chain.pushes)
	require.Equal(t, 1, pauses(rn))
	require.True(t, rn.bp.paused)
	require.False(t, b.Ack.Failed())
}

// A negative grace pauses on the first refusal, as before the grace.
func TestBlockedBatchWithNegativeGracePausesAtOnce(t *testing.T) {
	chain := &roomChain{blockingChain: blockingChain{blocks: 1}}
	rn := newTestRunner(t, chain, -1)
	require.Nil(t, rn.runBatch(testBatch(t)))
	require.Equal(t, 1, pauses(rn))
	require.True(t, rn.bp.paused)
}

// A chain that cannot wait for room pauses the source on its first refusal,
// whatever the grace.
func TestBlockedChainWithoutRoomWaitPausesAtOnce(t *testing.T) {
	chain := &blockingChain{blocks: 1}
	rn := newTestRunner(t, chain, time.Hour)
	require.Nil(t, rn.runBatch(testBatch(t)))
	require.Equal(t, 1, pauses(rn))
	require.True(t, rn.bp.paused)
}
