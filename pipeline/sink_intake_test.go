package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"
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
	budget := NewInflightBudget(1 << 30)
	s := NewSinkRuntime("grow", sink, SinkOptions{Shards: 1, QueueCapacity: 64, Linger: time.Millisecond}, budget)
	s.start(nil, nil)
	send := func(records int) {
		t.Helper()
		ch := &chunk{records: make([]Record, records), bytes: int64(records)}
		budget.Add(ch.bytes)
		if !s.trySend(0, ch) {
			t.Fatal("the queue refused a chunk")
		}
	}
	send(1)
	select {
	case <-sink.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never started")
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
		if time.Now().After(deadline) {
			t.Fatalf("%d chunks still queued behind the busy writer: the intake stopped taking them", s.depth[0].Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r := s.drain(ctx); r.Abandoned > 0 || r.Overran {
		t.Fatalf("drain: %+v", r)
	}
	got := sink.writes()
	if len(got) != 2 || got[0] != 1 || got[1] != 40 {
		t.Fatalf("writes of %v records, want [1 40]: the slow write's successor takes everything queued behind it", got)
	}
	if budget.Usage() != 0 {
		t.Fatalf("%d bytes still counted in flight", budget.Usage())
	}
}
