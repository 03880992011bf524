package pipeline_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
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
	// allDone, when set, is closed by the last of lanes lanes to finish.
	allDone chan struct{}
	lanes   int32
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
			if l.finished.Add(1) == l.lanes && l.allDone != nil {
				close(l.allDone)
			}
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

// benchSource assigns its lanes, then reports Drained once all finished:
// like a real source, its PollEvents returns as soon as that happens.
type benchSource struct {
	pipeline.BaseSource
	lanes    int
	total    int64
	finished atomic.Int32
	allDone  chan struct{}
	assigned bool
	issuer   *pipeline.AckIssuer
	pauses   atomic.Int32
}

func (s *benchSource) Open(ctx pipeline.SourceCtx) error {
	s.issuer = ctx.Issuer
	s.allDone = make(chan struct{})
	return nil
}

// newLane returns the source's lane i.
func (s *benchSource) newLane(i int) *benchLane {
	l := newBenchLane(i, s.total, s.issuer.Clone(), &s.finished)
	l.allDone, l.lanes = s.allDone, int32(s.lanes)
	return l
}

func (s *benchSource) PollEvents(timeout time.Duration) (pipeline.SourceEvent, error) {
	if !s.assigned {
		s.assigned = true
		var ls []pipeline.Lane
		for i := range s.lanes {
			ls = append(ls, s.newLane(i))
		}
		return pipeline.AssignedEvent(ls...), nil
	}
	if int(s.finished.Load()) == s.lanes {
		return pipeline.DrainedEvent(), nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.allDone:
		return pipeline.DrainedEvent(), nil
	case <-t.C:
		return pipeline.IdleEvent(), nil
	}
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
// runtime (controller, runner, real chain, sink queues and writer,
// acknowledgments, checkpointing, commits) against a fair hand-off loop
// that does the same work by hand, and against a bare loop.
//
// Every op moves the same records (benchLanes x benchRecordsPerLane), so
// ns/op compares directly:
//
//	fair/sink=nop     the fair loop of issue 17: the same lanes, 512-record
//	                  polls, records copied into 64 KiB chunks holding
//	                  their batches' ack handles, a bounded queue of 64
//	                  chunks to a sink goroutine calling WriteChunks
//	                  (no-op sink), chunks reused. It copies record by
//	                  record the plain way (append a Record).
//	runtime/sink=nop  the runtime (1 thread, 1 shard, queue 64) into the
//	                  no-op sink. runtime/fair is the overhead ratio.
//	fairtuned/sink=nop
//	                  the fair loop with the runtime's own copy loop
//	                  (slices in locals, records filled in place): the
//	                  stricter baseline, runtime/fairtuned is the overhead
//	                  of everything but the copy.
//	fair/sink=file, runtime/sink=file
//	                  the fair pair writing one FileSink file (fsynced).
//	bare              the old do-nothing loop (poll, touch, release): a
//	                  reference line, not a baseline for the ratio.
//	tuning/...        other runtime shapes (queue size, threads).
//
// The ratio is one command:
//
//	go test -run '^$' -bench 'Throughput/(fair|runtime)' -benchmem -count 6 ./pipeline | tee tp.txt
//
// -count repeats each line back to back; on a shared machine interleave
// the pairs instead, one binary run after another:
//
//	go test -c -o tp.test ./pipeline
//	for i in 1 2 3 4 5 6; do ./tp.test -test.run '^$' -test.bench 'Throughput/(fair|runtime)' -test.benchmem; done | tee tp.txt
//
// benchstat puts the pairs side by side once the loop is a key:
//
//	sed -E 's#Throughput/(fair|fairtuned|runtime)/#Throughput/loop=\1/#' tp.txt > tp-loop.txt
//	benchstat -col /loop tp-loop.txt
//
// Each line also reports records/s, B/record (bytes allocated per record:
// -benchmem's B/op divided by the records of an op) and cpu-ns/op (CPU
// time of the whole process per op, steadier than ns/op when other work
// shares the machine).
func BenchmarkThroughput(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		measure(b, func(b *testing.B) {
			_, lanes := fairLanes()
			finished, sum := 0, 0
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
			require.Equal(b, benchRecords*100, sum, "bytes the bare loop saw")
		})
	})
	for _, sk := range []string{"nop", "file"} {
		b.Run("fair/sink="+sk, func(b *testing.B) {
			sinks := newBenchSinks(b, sk)
			measure(b, func(b *testing.B) {
				sink := sinks.open(b)
				fairLoop(b, sink, false)
				sinks.check(b, sink)
			})
		})
		if sk == "nop" {
			b.Run("fairtuned/sink=nop", func(b *testing.B) {
				measure(b, func(b *testing.B) { fairLoop(b, pipeline.NopSink{}, true) })
			})
		}
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

// measure runs op once per iteration and reports records/s, the bytes
// allocated per record and the CPU time per op.
//
// One op runs before the timed loop, outside both the timer and the
// allocation count (-benchmem's B/op and B/record), and its allocation is
// reported on its own as warmup-B/record: the first op fills the pools
// (the runtime's chunks, the fair loop's free list) with what the ops keep
// in flight — with FileSink about the whole op's records, some 220 MB —
// which, amortized over a b.N of 5 to 30, made B/record swing from 4 to
// 38 with b.N. B/record is the steady state.
func measure(b *testing.B, op func(b *testing.B)) {
	b.ReportAllocs()
	var warm, before, after runtime.MemStats
	runtime.ReadMemStats(&warm)
	op(b)
	runtime.ReadMemStats(&before)
	warmup := float64(before.TotalAlloc-warm.TotalAlloc) / float64(benchRecords)
	cpu := cpuTime()
	n := 0
	for b.Loop() {
		op(b)
		n++
	}
	if cpu >= 0 {
		// All goroutines, user and system; it includes what the timer
		// skipped (a FileSink's check).
		b.ReportMetric(float64(cpuTime()-cpu)/float64(n), "cpu-ns/op")
	}
	runtime.ReadMemStats(&after)
	recs := float64(benchRecords) * float64(n)
	b.ReportMetric(recs/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/recs, "B/record")
	b.ReportMetric(warmup, "warmup-B/record") // after the loop: b.Loop's start drops earlier metrics
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
	fs, err := filesink.NewFileSink(s.dir, "bench")
	require.NoError(b, err)
	return fs
}

func (s *benchSinks) check(b *testing.B, sink pipeline.ChunkedSink) {
	fs, ok := sink.(*filesink.FileSink)
	if !ok {
		return
	}
	b.StopTimer()
	defer b.StartTimer()
	require.NoError(b, fs.Close())
	st, err := os.Stat(fs.Path(0))
	require.NoError(b, err)
	// Each record is a line: an empty key, a tab, 100 bytes, a newline.
	require.Equal(b, int64(benchRecords*102), st.Size(), "bytes in the file")
	require.NoError(b, os.Remove(fs.Path(0)))
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

// fairFree is the fair loop's free list of chunks: a stack, so the chunk
// freed last, likeliest still in cache, is reused first (as the runtime's
// free list does). It outlives an op, as the runtime's chunk pool
// outlives a run, so neither pays for warming its buffers in every op.
var fairFree struct {
	sync.Mutex
	stack []*fairChunk
}

// fairLoop is the fair hand-off loop: one goroutine polls the lanes
// round-robin (512 records a poll) and copies every record into 64 KiB
// chunks; a bounded queue of 64 chunks feeds a sink goroutine that writes
// whatever is queued with one WriteChunks, delivers the chunks' acks and
// returns the chunks for reuse. tuned copies with the runtime's copy loop.
func fairLoop(b *testing.B, sink pipeline.ChunkedSink, tuned bool) {
	_, lanes := fairLanes()
	queue := make(chan *fairChunk, fairQueue)
	type result struct {
		records int
		err     error
	}
	written := make(chan result)
	go func() {
		var held []*fairChunk
		var chunks [][]pipeline.Record
		var res result
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
				res.records += len(c.records)
			}
			if err := sink.WriteChunks(context.Background(), 0, chunks); err != nil && res.err == nil {
				res.err = err
			}
			fairFree.Lock()
			for _, c := range held {
				c.acks.Deliver()
				c.records, c.arena, c.bytes = c.records[:0], c.arena[:0], 0
				fairFree.stack = append(fairFree.stack, c)
			}
			fairFree.Unlock()
		}
		written <- res
	}()
	newChunk := func() *fairChunk {
		fairFree.Lock()
		defer fairFree.Unlock()
		if n := len(fairFree.stack); n > 0 {
			c := fairFree.stack[n-1]
			fairFree.stack = fairFree.stack[:n-1]
			return c
		}
		return &fairChunk{arena: make([]byte, 0, fairChunkBytes+fairChunkBytes/4)}
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
			if !tuned {
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
				continue
			}
			// The runtime's copy loop (terminal.addRun): the chunk's
			// slices in locals, the ack reference taken once per chunk,
			// each record filled in place.
			ps := batch.Payloads
			for i := 0; i < len(ps); {
				cur.acks.AddOnce(batch.Ack)
				recs, arena, bytes := cur.records, cur.arena, cur.bytes
				for ; i < len(ps) && bytes < fairChunkBytes; i++ {
					p := &ps[i]
					start := len(arena)
					arena = append(arena, p.Key...)
					arena = append(arena, p.Value...)
					n := len(recs)
					if n < cap(recs) {
						recs = recs[:n+1]
					} else {
						recs = append(recs, pipeline.Record{})
					}
					r := &recs[n]
					r.Key = nil
					if p.Key != nil {
						r.Key = arena[start : start+len(p.Key) : start+len(p.Key)]
					}
					vs := start + len(p.Key)
					r.Value = arena[vs : vs+len(p.Value) : vs+len(p.Value)]
					r.Partition, r.Offset, r.TimestampMs = p.Partition, p.Offset, p.TimestampMs
					bytes += len(p.Key) + len(p.Value) + 16
				}
				cur.records, cur.arena, cur.bytes = recs, arena, bytes
				if bytes >= fairChunkBytes {
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
	w := <-written
	require.NoError(b, w.err)
	require.Equal(b, benchRecords, w.records, "records the fair loop wrote")
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
	require.NoError(b, err)
	r, err := rt.Run(context.Background())
	require.NoError(b, err)
	require.Equal(b, pipeline.Completed, r.State)
	require.Len(b, r.FinalWatermarks, benchLanes)
	for _, w := range r.FinalWatermarks {
		require.Equal(b, int64(benchRecordsPerLane), w.Offset, "final watermark of partition %d", w.Partition)
	}
	return int(src.pauses.Load())
}
