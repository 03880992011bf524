package pipeline_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spate-go/spate/pipeline"
)

// benchLane serves total records in batches, reusing one payload buffer
// (legal: payloads are valid until the lane's next poll).
type benchLane struct {
	id       pipeline.LaneID
	issuer   *pipeline.AckIssuer
	total    int64
	next     int64
	buf      []pipeline.RawPayload
	value    []byte
	finished *atomic.Int32
	done     bool
	// valueOf, when set, appends the value of the record at an offset,
	// and every value of a poll then shares one reused buffer.
	valueOf func(dst []byte, p pipeline.PartitionID, off int64) []byte
	scratch []byte
}

func newBenchLane(id int, total int64, issuer *pipeline.AckIssuer, finished *atomic.Int32) *benchLane {
	return &benchLane{id: pipeline.LaneID(id), issuer: issuer, total: total, value: make([]byte, 100), finished: finished}
}

func (l *benchLane) ID() pipeline.LaneID             { return l.id }
func (l *benchLane) Partition() pipeline.PartitionID { return pipeline.PartitionID(l.id) }

func (l *benchLane) Poll(max int, _ time.Duration) (*pipeline.Batch, error) {
	if l.next >= l.total {
		if !l.done {
			l.done = true
			l.finished.Add(1)
		}
		return nil, nil
	}
	n := min(int64(max), l.total-l.next)
	l.buf = l.buf[:0]
	for i := range n {
		l.buf = append(l.buf, pipeline.RawPayload{Value: l.value, Partition: l.Partition(), Offset: l.next + i})
	}
	if l.valueOf != nil {
		l.scratch = l.scratch[:0]
		for i := range l.buf {
			start := len(l.scratch)
			l.scratch = l.valueOf(l.scratch, l.Partition(), l.next+int64(i))
			l.buf[i].Value = l.scratch[start:len(l.scratch):len(l.scratch)]
		}
	}
	l.next += n
	return &pipeline.Batch{Payloads: l.buf, Ack: l.issuer.Issue(l.Partition(), l.next-1)}, nil
}

// benchSource assigns its lanes, then reports Drained once all finished.
type benchSource struct {
	pipeline.BaseSource
	lanes    int
	total    int64
	finished atomic.Int32
	assigned bool
	issuer   *pipeline.AckIssuer
	pauses   atomic.Int32
}

func (s *benchSource) Open(ctx pipeline.SourceCtx) error { s.issuer = ctx.Issuer; return nil }

func (s *benchSource) PollEvents(timeout time.Duration) (pipeline.SourceEvent, error) {
	if !s.assigned {
		s.assigned = true
		var ls []pipeline.Lane
		for i := range s.lanes {
			ls = append(ls, newBenchLane(i, s.total, s.issuer.Clone(), &s.finished))
		}
		return pipeline.AssignedEvent(ls...), nil
	}
	if int(s.finished.Load()) == s.lanes {
		return pipeline.DrainedEvent(), nil
	}
	time.Sleep(timeout)
	return pipeline.IdleEvent(), nil
}

func (s *benchSource) Commit([]pipeline.Watermark) error { return nil }

func (s *benchSource) Pause([]pipeline.LaneID) error { s.pauses.Add(1); return nil }

const (
	benchLanes          = 4
	benchRecordsPerLane = 250_000
)

// BenchmarkThroughput compares records per second through the whole
// runtime (controller, driver, real chain, sink queues, no-op sink writer,
// acknowledgments, checkpointing, commits) with a bare loop that polls the
// same lanes and touches every record. Run both in one invocation; the
// ratio of their records/s is the runtime's overhead.
func BenchmarkThroughput(b *testing.B) {
	total := float64(benchLanes * benchRecordsPerLane)
	b.Run("bare", func(b *testing.B) {
		var elapsed time.Duration
		for b.Loop() {
			start := time.Now()
			cp := pipeline.NewCheckpointer(nil)
			var parts []pipeline.PartitionID
			for i := range benchLanes {
				parts = append(parts, pipeline.PartitionID(i))
			}
			_ = cp.BeginEpoch(parts, 1)
			var finished atomic.Int32
			var lanes []*benchLane
			for i := range benchLanes {
				lanes = append(lanes, newBenchLane(i, benchRecordsPerLane, cp.Issuer(), &finished))
			}
			var sum int
			for int(finished.Load()) < benchLanes {
				for _, l := range lanes {
					batch, _ := l.Poll(512, 0)
					if batch == nil {
						continue
					}
					for i := range batch.Payloads {
						sum += len(batch.Payloads[i].Value)
					}
					batch.Ack.Release()
				}
			}
			if sum != int(total)*100 {
				b.Fatalf("bare loop saw %d bytes", sum)
			}
			elapsed += time.Since(start)
		}
		b.ReportMetric(total*float64(b.N)/elapsed.Seconds(), "records/s")
	})
	for _, v := range []struct {
		name          string
		threads, qcap int
	}{{"runtime/threads=1/queue=8", 1, 8}, {"runtime/threads=1/queue=64", 1, 64}, {"runtime/threads=2/queue=64", 2, 64}} {
		b.Run(v.name, func(b *testing.B) {
			var elapsed time.Duration
			pauses := 0
			for b.Loop() {
				src := &benchSource{lanes: benchLanes, total: benchRecordsPerLane}
				cfg := pipeline.Config{
					Name: "bench", Threads: v.threads, CommitInterval: 100 * time.Millisecond,
					EventPollTimeout: time.Millisecond, PollTimeout: time.Millisecond, MinPause: 10 * time.Millisecond,
				}
				rt, err := pipeline.Build(cfg, src, nil, []pipeline.SinkSpec{{
					Name: "nop", Sink: pipeline.NopSink{},
					Options: pipeline.SinkOptions{Shards: v.threads, QueueCapacity: v.qcap, Linger: time.Millisecond},
				}}, pipeline.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				r, err := rt.Run(context.Background())
				elapsed += time.Since(start)
				pauses += int(src.pauses.Load())
				if err != nil || r.State != pipeline.Completed || len(r.FinalWatermarks) != benchLanes {
					b.Fatalf("run: %+v %v", r, err)
				}
			}
			b.ReportMetric(total*float64(b.N)/elapsed.Seconds(), "records/s")
			b.ReportMetric(float64(pauses)/float64(b.N), "pauses/op")
		})
	}
}
