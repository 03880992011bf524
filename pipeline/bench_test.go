package pipeline_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
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
	benchRecords        = benchLanes * benchRecordsPerLane

	// The fair loop's shape, which the runtime's benchmark configuration
	// matches: 512-record polls, 64 KiB chunks, a queue of 64 chunks.
	fairPoll       = 512
	fairChunkBytes = 64 << 10
	fairQueue      = 64
)

// BenchmarkThroughput measures records per second through the whole
// runtime (controller, driver, real chain, sink queues and writer,
// acknowledgments, checkpointing, commits) against a fair hand-off loop
// that does the same work by hand, and against a bare loop.
//
// Every op moves the same records (benchLanes x benchRecordsPerLane), so
// ns/op compares directly:
//
//	fair/sink=nop     the fair loop: the same lanes, 512-record polls,
//	                  records copied into 64 KiB chunks holding their
//	                  batches' ack handles, a bounded queue of 64 chunks to
//	                  a sink goroutine calling WriteChunks (no-op sink).
//	runtime/sink=nop  the runtime (1 thread, 1 shard, queue 64) into the
//	                  no-op sink. runtime/fair is the overhead ratio.
//	fair/sink=file, runtime/sink=file
//	                  the same pair writing one FileSink file (fsynced).
//	bare              the old do-nothing loop (poll, touch, release): a
//	                  reference line, not a baseline for the ratio.
//	tuning/...        other runtime shapes (queue size, threads).
//
// The ratio is one command (both loops run interleaved in one process):
//
//	go test -run '^$' -bench 'Throughput/(fair|runtime)' -benchmem -count 6 ./pipeline | tee tp.txt
//
// and benchstat puts the pairs side by side once the loop is a key:
//
//	sed -E 's#Throughput/(fair|runtime)/#Throughput/loop=\1/#' tp.txt > tp-loop.txt
//	benchstat -col /loop tp-loop.txt
//
// Each line also reports records/s and B/record (bytes allocated per
// record; -benchmem's B/op divided by the records of an op).
func BenchmarkThroughput(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		measure(b, func(b *testing.B) {
			cp, lanes := fairLanes()
			_ = cp
			var finished int
			var sum int
			for finished < len(lanes) {
				finished = 0
				for _, l := range lanes {
					batch, _ := l.Poll(fairPoll, 0)
					if batch == nil {
						finished++
						continue
					}
					for i := range batch.Payloads {
						sum += len(batch.Payloads[i].Value)
					}
					batch.Ack.Release()
				}
			}
			if sum != benchRecords*100 {
				b.Fatalf("bare loop saw %d bytes", sum)
			}
		})
	})
	for _, sk := range []string{"nop", "file"} {
		b.Run("fair/sink="+sk, func(b *testing.B) {
			sinks := newBenchSinks(b, sk)
			measure(b, func(b *testing.B) {
				sink := sinks.open(b)
				fairLoop(b, sink)
				sinks.check(b, sink)
			})
		})
		b.Run("runtime/sink="+sk, func(b *testing.B) {
			sinks := newBenchSinks(b, sk)
			pauses := 0
			measure(b, func(b *testing.B) {
				sink := sinks.open(b)
				pauses += runRuntime(b, sink, 1, fairQueue)
				sinks.check(b, sink)
			})
			b.ReportMetric(float64(pauses)/float64(b.N), "pauses/op")
		})
	}
	for _, v := range []struct {
		name          string
		threads, qcap int
	}{{"tuning/threads=1/queue=8", 1, 8}, {"tuning/threads=2/queue=64", 2, 64}} {
		b.Run(v.name, func(b *testing.B) {
			pauses := 0
			measure(b, func(b *testing.B) { pauses += runRuntime(b, pipeline.NopSink{}, v.threads, v.qcap) })
			b.ReportMetric(float64(pauses)/float64(b.N), "pauses/op")
		})
	}
}

// measure runs op once per iteration and reports records/s and the bytes
// allocated per record.
func measure(b *testing.B, op func(b *testing.B)) {
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		op(b)
		n++
	}
	runtime.ReadMemStats(&after)
	recs := float64(benchRecords) * float64(n)
	b.ReportMetric(recs/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/recs, "B/record")
}

// benchSinks hands each op a fresh sink: the no-op sink, or a FileSink
// whose file is checked and removed after the op (outside the timer).
type benchSinks struct {
	kind string
	dir  string
}

func newBenchSinks(b *testing.B, kind string) *benchSinks {
	s := &benchSinks{kind: kind}
	if kind == "file" {
		s.dir = b.TempDir()
	}
	return s
}

func (s *benchSinks) open(b *testing.B) pipeline.ChunkedSink {
	if s.kind != "file" {
		return pipeline.NopSink{}
	}
	fs, err := pipeline.NewFileSink(s.dir, "bench")
	if err != nil {
		b.Fatal(err)
	}
	return fs
}

func (s *benchSinks) check(b *testing.B, sink pipeline.ChunkedSink) {
	fs, ok := sink.(*pipeline.FileSink)
	if !ok {
		return
	}
	b.StopTimer()
	defer b.StartTimer()
	if err := fs.Close(); err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(fs.Path(0))
	if err != nil {
		b.Fatal(err)
	}
	// Each record is a line: an empty key, a tab, 100 bytes, a newline.
	if want := int64(benchRecords * 102); st.Size() != want {
		b.Fatalf("the file holds %d bytes, want %d", st.Size(), want)
	}
	if err := os.Remove(fs.Path(0)); err != nil {
		b.Fatal(err)
	}
}

// fairLanes returns the benchmark's lanes on a checkpointer in epoch 1.
func fairLanes() (*pipeline.Checkpointer, []*benchLane) {
	cp := pipeline.NewCheckpointer(nil)
	parts := make([]pipeline.PartitionID, benchLanes)
	for i := range parts {
		parts[i] = pipeline.PartitionID(i)
	}
	_ = cp.BeginEpoch(parts, 1)
	finished := new(atomic.Int32)
	lanes := make([]*benchLane, benchLanes)
	for i := range lanes {
		lanes[i] = newBenchLane(i, benchRecordsPerLane, cp.Issuer(), finished)
	}
	return cp, lanes
}

// fairChunk is the fair loop's unit of hand-off: records whose bytes live
// in the chunk's arena, and one reference to each batch they came from.
type fairChunk struct {
	records []pipeline.Record
	arena   []byte
	bytes   int
	acks    pipeline.AckSet
}

// fairLoop is the fair hand-off loop: one goroutine polls the lanes
// round-robin (512 records a poll) and copies every record into 64 KiB
// chunks; a bounded queue of 64 chunks feeds a sink goroutine that writes
// whatever is queued with one WriteChunks, delivers the chunks' acks and
// returns the chunks for reuse.
func fairLoop(b *testing.B, sink pipeline.ChunkedSink) {
	_, lanes := fairLanes()
	queue := make(chan *fairChunk, fairQueue)
	free := make(chan *fairChunk, 2*fairQueue+2) // every chunk in flight fits
	written := make(chan int)
	go func() {
		var held []*fairChunk
		var chunks [][]pipeline.Record
		n := 0
		for ch := range queue {
			held = append(held[:0], ch)
		more:
			for len(held) < fairQueue {
				select {
				case c, ok := <-queue:
					if !ok {
						break more
					}
					held = append(held, c)
				default:
					break more
				}
			}
			chunks = chunks[:0]
			for _, c := range held {
				chunks = append(chunks, c.records)
				n += len(c.records)
			}
			if err := sink.WriteChunks(context.Background(), 0, chunks); err != nil {
				panic(err)
			}
			for _, c := range held {
				c.acks.Deliver()
				c.records, c.arena, c.bytes = c.records[:0], c.arena[:0], 0
				select {
				case free <- c:
				default:
				}
			}
		}
		written <- n
	}()
	newChunk := func() *fairChunk {
		select {
		case c := <-free:
			return c
		default:
			return &fairChunk{arena: make([]byte, 0, fairChunkBytes+fairChunkBytes/4)}
		}
	}
	cur := newChunk()
	for finished := 0; finished < len(lanes); {
		finished = 0
		for _, l := range lanes {
			batch, _ := l.Poll(fairPoll, 0)
			if batch == nil {
				finished++
				continue
			}
			for i := range batch.Payloads {
				p := &batch.Payloads[i]
				start := len(cur.arena)
				cur.arena = append(cur.arena, p.Key...)
				cur.arena = append(cur.arena, p.Value...)
				r := pipeline.Record{Partition: p.Partition, Offset: p.Offset, TimestampMs: p.TimestampMs}
				if p.Key != nil {
					r.Key = cur.arena[start : start+len(p.Key) : start+len(p.Key)]
				}
				vs := start + len(p.Key)
				r.Value = cur.arena[vs : vs+len(p.Value) : vs+len(p.Value)]
				cur.records = append(cur.records, r)
				cur.bytes += len(p.Key) + len(p.Value) + 16
				cur.acks.AddOnce(batch.Ack)
				if cur.bytes >= fairChunkBytes {
					queue <- cur
					cur = newChunk()
				}
			}
			batch.Ack.Release()
		}
	}
	if len(cur.records) > 0 {
		queue <- cur
	}
	close(queue)
	if n := <-written; n != benchRecords {
		b.Fatalf("the fair loop wrote %d records, want %d", n, benchRecords)
	}
}

// runRuntime runs the benchmark source through the runtime into sink and
// returns how often the runtime paused the source.
func runRuntime(b *testing.B, sink pipeline.ChunkedSink, threads, qcap int) int {
	src := &benchSource{lanes: benchLanes, total: benchRecordsPerLane}
	cfg := pipeline.Config{
		Name: "bench", Threads: threads, CommitInterval: 100 * time.Millisecond, MaxRecords: fairPoll,
		EventPollTimeout: time.Millisecond, PollTimeout: time.Millisecond, MinPause: 10 * time.Millisecond,
	}
	rt, err := pipeline.Build(cfg, src, nil, []pipeline.SinkSpec{{
		Name: "bench", Sink: sink,
		Options: pipeline.SinkOptions{Shards: threads, QueueCapacity: qcap, ChunkTargetBytes: fairChunkBytes, Linger: time.Millisecond},
	}}, pipeline.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		b.Fatal(err)
	}
	r, err := rt.Run(context.Background())
	if err != nil || r.State != pipeline.Completed || len(r.FinalWatermarks) != benchLanes {
		b.Fatalf("run: %+v %v", r, err)
	}
	for _, w := range r.FinalWatermarks {
		if w.Offset != benchRecordsPerLane {
			b.Fatalf("final watermark %+v, want offset %d", w, benchRecordsPerLane)
		}
	}
	return int(src.pauses.Load())
}
