package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

// appendValue appends the value of the record at (p, off).
func appendValue(dst []byte, p pipeline.PartitionID, off int64) []byte {
	dst = fmt.Appendf(dst, "p%d/o%d/", p, off)
	for i := range int(off % 97) {
		dst = append(dst, byte('a'+(off+int64(i))%26))
	}
	return dst
}

type contentSource struct{ benchSource }

func (s *contentSource) PollEvents(timeout time.Duration) (pipeline.SourceEvent, error) {
	if !s.assigned {
		s.assigned = true
		var ls []pipeline.Lane
		for i := range s.lanes {
			l := s.newLane(i)
			l.valueOf = appendValue
			ls = append(ls, l)
		}
		return pipeline.AssignedEvent(ls...), nil
	}
	return s.benchSource.PollEvents(timeout)
}

// checkingSink checks every record it is handed against the content its
// partition and offset imply, fails some writes (retried) and stalls some,
// and counts what it accepted.
type checkingSink struct {
	mu       sync.Mutex
	rng      *rand.Rand
	bad      atomic.Int64
	firstBad atomic.Pointer[string]
	seen     map[[2]int64]bool
}

func (s *checkingSink) check(records []pipeline.Record) {
	var want []byte
	for _, r := range records {
		want = appendValue(want[:0], r.Partition, r.Offset)
		if string(r.Value) != string(want) {
			if s.bad.Add(1) == 1 {
				msg := fmt.Sprintf("partition %d offset %d: value %q, want %q", r.Partition, r.Offset, r.Value, want)
				s.firstBad.Store(&msg)
			}
		}
	}
}

func (s *checkingSink) write(chunks [][]pipeline.Record) error {
	for _, c := range chunks {
		s.check(c)
	}
	s.mu.Lock()
	fail, stall := s.rng.IntN(10) == 0, s.rng.IntN(10) == 0
	s.mu.Unlock()
	if stall {
		time.Sleep(2 * time.Millisecond) // hold these records while others are built
	}
	for _, c := range chunks {
		s.check(c) // still intact after other chunks were filled meanwhile
	}
	if fail {
		return errors.New("injected write failure")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range chunks {
		for _, r := range c {
			s.seen[[2]int64{int64(r.Partition), r.Offset}] = true
		}
	}
	return nil
}

type flatCheckingSink struct{ *checkingSink }

func (s flatCheckingSink) Write(_ context.Context, _ int, records []pipeline.Record) error {
	return s.write([][]pipeline.Record{records})
}

type chunkedCheckingSink struct{ flatCheckingSink }

func (s chunkedCheckingSink) WriteChunks(_ context.Context, _ int, chunks [][]pipeline.Record) error {
	return s.write(chunks)
}

// Chunk arenas are recycled once their batch is written: no record a sink
// is handed — through Write or WriteChunks, on a first attempt or a retry,
// while other chunks fill — ever shows another record's bytes, and every
// record arrives.
func TestRecycledArenasNeverAliasLiveRecords(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%t", chunked), func(t *testing.T) {
			const lanes, perLane = 3, 20_000
			cs := &checkingSink{rng: rand.New(rand.NewPCG(1, 2)), seen: map[[2]int64]bool{}}
			var sink pipeline.Sink = flatCheckingSink{cs}
			if chunked {
				sink = chunkedCheckingSink{flatCheckingSink{cs}}
			}
			src := &contentSource{benchSource{lanes: lanes, total: perLane}}
			rt, err := pipeline.Build(pipeline.Config{Name: "arena", Threads: 2, CommitInterval: 20 * time.Millisecond,
				EventPollTimeout: time.Millisecond, PollTimeout: time.Millisecond, MinPause: time.Millisecond}, src, nil,
				[]pipeline.SinkSpec{{Name: "check", Sink: sink, Options: pipeline.SinkOptions{Shards: 2, QueueCapacity: 4,
					ChunkTargetBytes: 4 << 10, Linger: time.Millisecond, RetryInitial: time.Millisecond}}},
				pipeline.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := rt.Run(ctx)
			require.NoError(t, err, "run: %v", r.State)
			require.Equal(t, pipeline.Completed, r.State, "run: %v %v", r.State, err)
			if n := cs.bad.Load(); n > 0 {
				require.FailNowf(t, "records showed bytes that were not theirs", "%d of them; first: %s", n, *cs.firstBad.Load())
			}
			require.Len(t, cs.seen, lanes*perLane, "the sink accepted %d distinct records, want %d", len(cs.seen), lanes*perLane)
		})
	}
}
