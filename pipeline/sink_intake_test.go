package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blockingSink blocks its first write until release is closed and records
// every write's record count.
type blockingSink struct {
	started chan struct{} // closed when the first write begins
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	sizes   []int
}

func (s *blockingSink) Write(ctx context.Context, _ int, records []Record) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.started)
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	s.sizes = append(s.sizes, len(records))
	s.mu.Unlock()
	return nil
}

func (s *blockingSink) writes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.sizes...)
}

// While a write is under way, the next batch takes in every chunk that
// arrives, lingered or not, so that the write after a slow one carries
// everything that queued up behind it: one write (and one fsync) instead
// of a small batch per linger and a queue full behind them.
func TestBatchGrowsWhileTheWriterIsBusy(t *testing.T) {
	sink := &blockingSink{started: make(chan struct{}), release: make(chan struct{})}
	budget := newInflightBudget(1 << 30)
	s := newSinkRuntime("grow", sink, SinkOptions{Shards: 1, QueueCapacity: 64, Linger: time.Millisecond}, budget)
	s.start(nil, nil)
	send := func(records int) {
		t.Helper()
		ch := &chunk{records: make([]Record, records), bytes: int64(records)}
		budget.Add(ch.bytes)
		require.True(t, s.trySend(0, ch), "the queue refused a chunk")
	}
	send(1)
	select {
	case <-sink.started:
	case <-time.After(10 * time.Second):
		require.Fail(t, "the first write never started")
	}
	// Four groups of chunks, each well past the linger of the one before.
	for range 4 {
		for range 5 {
			send(2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.depth[0].Load() > 0 {
		require.False(t, time.Now().After(deadline), "%d chunks still queued behind the busy writer: the intake stopped taking them", s.depth[0].Load())
		time.Sleep(time.Millisecond)
	}
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := s.drain(ctx)
	require.Zero(t, r.Abandoned, "drain: %+v", r)
	require.False(t, r.Overran, "drain: %+v", r)
	got := sink.writes()
	require.Equal(t, []int{1, 40}, got, "writes of %v records, want [1 40]: the slow write's successor takes everything queued behind it", got)
	require.Zero(t, budget.Usage(), "%d bytes still counted in flight", budget.Usage())
}

// While a write is under way, a lingered batch takes in at most a queue's
// worth of chunks; the rest stay queued (the queue then refuses more, which
// is the backpressure), so a sink slower than its source keeps a bounded
// number of chunks in flight instead of up to two batch caps.
func TestBatchTakesAQueueWorthWhileTheWriterIsBusy(t *testing.T) {
	sink := &blockingSink{started: make(chan struct{}), release: make(chan struct{})}
	budget := newInflightBudget(1 << 30)
	const queue = 4
	s := newSinkRuntime("bounded", sink, SinkOptions{Shards: 1, QueueCapacity: queue, Linger: time.Millisecond}, budget)
	s.start(nil, nil)
	send := func(records int) bool {
		ch := &chunk{records: make([]Record, records), bytes: int64(records)}
		if !s.trySend(0, ch) {
			return false
		}
		budget.Add(ch.bytes)
		return true
	}
	waitDepth := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for s.depth[0].Load() != want {
			require.False(t, time.Now().After(deadline), "queue depth %d, want %d", s.depth[0].Load(), want)
			time.Sleep(time.Millisecond)
		}
	}
	require.True(t, send(1), "the queue refused the first chunk")
	select {
	case <-sink.started:
	case <-time.After(10 * time.Second):
		require.Fail(t, "the first write never started")
	}
	for range queue {
		require.True(t, send(2), "the queue refused a chunk")
	}
	waitDepth(0)                      // the next batch took a queue's worth
	time.Sleep(20 * time.Millisecond) // and lingered: it is due
	for range queue {
		require.True(t, send(2), "the queue refused a chunk")
	}
	time.Sleep(50 * time.Millisecond)
	waitDepth(queue) // left queued behind the due batch
	require.False(t, send(2), "the queue took a chunk past its capacity")
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := s.drain(ctx)
	require.Zero(t, r.Abandoned, "drain: %+v", r)
	require.False(t, r.Overran, "drain: %+v", r)
	got := sink.writes()
	total := 0
	for _, n := range got {
		total += n
	}
	require.GreaterOrEqual(t, len(got), 3, "writes of %v records, want [1 %d ...] totalling %d", got, 2*queue, 1+4*queue)
	require.Equal(t, 1, got[0], "writes of %v records, want [1 %d ...] totalling %d", got, 2*queue, 1+4*queue)
	require.Equal(t, 2*queue, got[1], "writes of %v records, want [1 %d ...] totalling %d", got, 2*queue, 1+4*queue)
	require.Equal(t, 1+4*queue, total, "writes of %v records, want [1 %d ...] totalling %d", got, 2*queue, 1+4*queue)
	require.Zero(t, budget.Usage(), "%d bytes still counted in flight", budget.Usage())
}
