package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spate-go/spate"
)

// Sink writes batches of records durably. Write returning nil means every
// record of the batch is durable: only then are the batches' sources
// acknowledged and their watermarks allowed to pass them.
//
// Ownership: the records slice, the bytes of every key and value, and (for
// [ChunkedSink]) the chunk list and each chunk's slice belong to the
// runtime and are lent to the sink for the duration of the call only. Once
// the call returns — with nil or with an error — the runtime reuses all of
// that memory for later records: record slices and byte arenas go back to
// a pool and are refilled by the chain. A sink must not keep any of it past
// its return, nor let another goroutine read it after the return: a sink
// that keeps a record must copy it (as [CaptureSink] does), and a sink that
// hands records to a helper goroutine must wait for the helper before it
// returns. A retry gets the same records again in the same memory. Memory
// lent to a call that never returns (a sink that ignores ctx past the
// drain's abort grace) is never reused.
//
// Write is called from one goroutine per shard, so different shards write
// concurrently; calls for one shard are sequential. A failed Write may have
// written part of the batch (the retry then duplicates it: at-least-once).
// An error satisfying errors.Is(err, spate.ErrFatal) abandons the batch at
// once; any other error is retried with backoff. Write must return promptly
// once ctx is done.
type Sink interface {
	Write(ctx context.Context, shard int, records []Record) error
}

// ChunkedSink is implemented by sinks that take a write as the runtime
// holds it, a list of chunks, which saves copying every record into one
// slice for [Sink.Write]. When a sink has it, the runtime calls WriteChunks
// instead of Write, with the same contract: the write is durable when it
// returns nil, the chunks, their records and the records' bytes are the
// runtime's and valid only during the call (see [Sink] for the ownership
// rule), and a failed write is retried whole.
//
// Beware embedding: a wrapper that embeds a ChunkedSink and overrides only
// Write still has the embedded WriteChunks, which the runtime then calls,
// bypassing the override. Such a wrapper must override both.
type ChunkedSink interface {
	Sink
	WriteChunks(ctx context.Context, shard int, chunks [][]Record) error
}

// SinkProber is implemented by sinks that can check their connection;
// readiness waits for the probe.
type SinkProber interface {
	Probe(ctx context.Context) error
}

// SinkOptions tune a [sinkRuntime]. A zero field takes its default.
type SinkOptions struct {
	// Shards is the number of queues and writer goroutines. Default 1.
	Shards int
	// QueueCapacity is each shard queue's capacity in chunks. Default 8.
	QueueCapacity int
	// ChunkTargetBytes seals a chunk once it holds this many bytes.
	// Default 64 KiB.
	ChunkTargetBytes int64
	// BatchMaxRecords and BatchMaxBytes cap a write. Defaults 500000 and
	// 128 MiB.
	BatchMaxRecords int
	BatchMaxBytes   int64
	// Linger is how long a partial batch waits for more chunks before it
	// is handed to the writer; while the writer is busy it takes in more
	// anyway, up to the batch caps. Default 1s.
	Linger time.Duration
	// RetryInitial, RetryMax and RetryJitter shape the write backoff
	// (doubling). Defaults 100ms, 10s, 0.2.
	RetryInitial, RetryMax time.Duration
	RetryJitter            float64
	// MaxAttempts abandons a batch after this many failed writes; 0 retries
	// until the drain deadline.
	MaxAttempts int
	// NoSpaceAttempts bounds the writes of a batch that fail with "no
	// space left on device" (an error wrapping syscall.ENOSPC): past it
	// the sink is failed for good, which fails the pipeline at once with
	// an error naming the destination, instead of retrying until the
	// drain deadline (or forever) while a disk stays full. Default 5
	// (about 1.5 s of backoff at the default RetryInitial); negative
	// retries ENOSPC like any other error.
	NoSpaceAttempts int
	// AbortGrace is how long a drain waits for writers after its deadline
	// before it gives up on them. Default 500ms.
	AbortGrace time.Duration
}

func (o SinkOptions) withDefaults() SinkOptions {
	if o.Shards <= 0 {
		o.Shards = 1
	}
	if o.QueueCapacity <= 0 {
		o.QueueCapacity = 8
	}
	if o.ChunkTargetBytes <= 0 {
		o.ChunkTargetBytes = 64 << 10
	}
	if o.BatchMaxRecords <= 0 {
		o.BatchMaxRecords = 500_000
	}
	if o.BatchMaxBytes <= 0 {
		o.BatchMaxBytes = 128 << 20
	}
	if o.Linger <= 0 {
		o.Linger = time.Second
	}
	if o.RetryInitial <= 0 {
		o.RetryInitial = 100 * time.Millisecond
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 10 * time.Second
	}
	if o.RetryJitter <= 0 {
		o.RetryJitter = 0.2
	}
	if o.AbortGrace <= 0 {
		o.AbortGrace = 500 * time.Millisecond
	}
	if o.NoSpaceAttempts == 0 {
		o.NoSpaceAttempts = 5
	}
	return o
}

// DrainReport says what a sink drain did.
type DrainReport struct {
	// Flushed counts batches written durably during the drain.
	Flushed uint64
	// Abandoned counts batches given up (their acknowledgments failed).
	Abandoned uint64
	// Overran is set when the drain hit its deadline.
	Overran bool
}

// sinkRuntime runs one sink: sharded bounded queues of chunks fed by the
// chain terminals without blocking, one writer goroutine per shard that
// batches chunks and writes them with retries, and the acknowledgments:
// delivered after a durable write, failed on every other way out.
type sinkRuntime struct {
	name   string
	sink   Sink
	opts   SinkOptions
	budget *inflightBudget
	log    *slog.Logger
	met    atomic.Pointer[metrics]
	h      sinkHandles

	queues []chan *chunk
	depth  []atomic.Int64
	// free recycles chunks — their record slices and byte arenas — once
	// their batch's write returned or the batch was abandoned: a sink may
	// not keep a record past its Write (the ownership rule on [Sink]).
	free chunkFreeList

	startOnce, closeOnce sync.Once
	workCtx              context.Context
	abort                context.CancelFunc
	wg                   sync.WaitGroup
	draining             atomic.Bool
	flushed, abandoned   atomic.Uint64
	lastFailure          atomic.Pointer[string]
	// fatal is set once the sink failed for good (a full disk); failed is
	// closed then, waking writers in their backoff, which from then on
	// abandon every batch without writing it.
	fatal     atomic.Pointer[FatalError]
	failed    chan struct{}
	fatalOnce sync.Once
}

// SinkDestination is implemented by sinks that can name where they write
// (a directory, a table), for error messages.
type SinkDestination interface {
	Destination() string
}

// Fatal is the error the sink failed with for good, nil while it has not.
func (s *sinkRuntime) Fatal() *FatalError { return s.fatal.Load() }

func (s *sinkRuntime) failFatal(fe *FatalError) {
	s.fatalOnce.Do(func() {
		s.fatal.Store(fe)
		close(s.failed)
	})
}

// noSpaceError is the fatal error of a sink out of space.
func (s *sinkRuntime) noSpaceError(attempts int, err error) *FatalError {
	dest := ""
	if d, ok := s.sink.(SinkDestination); ok {
		dest = " to " + d.Destination()
	}
	return fatalf("sink", "sink %q cannot write%s: no space left on device (%d attempts failed); free space and rerun: %v",
		s.name, dest, attempts, err)
}

// newSinkRuntime prepares a sink's queues; the pipeline starts its writers.
func newSinkRuntime(name string, sink Sink, opts SinkOptions, budget *inflightBudget) *sinkRuntime {
	opts = opts.withDefaults()
	s := &sinkRuntime{name: name, sink: sink, opts: opts, budget: budget, log: slog.Default()}
	s.free = chunkFreeList{max: 2*opts.QueueCapacity*opts.Shards + 8, overflow: chunkPool(opts.ChunkTargetBytes)}
	s.queues = make([]chan *chunk, opts.Shards)
	s.depth = make([]atomic.Int64, opts.Shards)
	for i := range s.queues {
		s.queues[i] = make(chan *chunk, opts.QueueCapacity)
	}
	s.workCtx, s.abort = context.WithCancel(context.Background())
	s.failed = make(chan struct{})
	return s
}

// Name is the sink's name.
func (s *sinkRuntime) Name() string { return s.name }

func (s *sinkRuntime) m() *metrics { return s.met.Load() }

func (s *sinkRuntime) newTerminal() *terminal {
	return &terminal{s: s, current: make([]*chunk, len(s.queues)), shardOf: map[*chunk]int{}, lastRecords: make([]int, len(s.queues))}
}

// sinkHandles are the sink's metric handles, resolved once at start.
type sinkHandles struct {
	depth                                                 []prometheus.Gauge
	full, abandoned, batchesOK, batchesAbandoned, records prometheus.Counter
	retries, overrun                                      prometheus.Counter
	writeDuration                                         prometheus.Observer
}

// start launches the writers. Idempotent.
func (s *sinkRuntime) start(m *metrics, log *slog.Logger) {
	s.startOnce.Do(func() {
		if log != nil {
			s.log = log.With("sink", s.name)
		}
		if m == nil {
			m, _ = newMetrics(s.name, nil) // unexported collectors
		}
		s.met.Store(m)
		comp := "sink:" + s.name
		for i := range s.queues {
			s.h.depth = append(s.h.depth, m.queueDepth.WithLabelValues(comp, "sink", strconv.Itoa(i)))
		}
		s.h.full = m.queueFull.WithLabelValues(comp, "sink")
		s.h.abandoned = m.sinkAbandoned.WithLabelValues(comp, "sink")
		s.h.batchesOK = m.sinkBatches.WithLabelValues(comp, "sink", "ok")
		s.h.batchesAbandoned = m.sinkBatches.WithLabelValues(comp, "sink", "abandoned")
		s.h.records = m.sinkRecords.WithLabelValues(comp, "sink")
		s.h.retries = m.sinkRetries.WithLabelValues(comp, "sink")
		s.h.overrun = m.sinkDrainOverrun.WithLabelValues(comp, "sink")
		s.h.writeDuration = m.sinkWriteDuration.WithLabelValues(comp, "sink")
		for i := range s.queues {
			s.wg.Add(1)
			go s.worker(i)
		}
	})
}

// trySend offers a sealed chunk to a shard queue without blocking.
func (s *sinkRuntime) trySend(shard int, ch *chunk) bool {
	select {
	case s.queues[shard] <- ch:
		s.depth[shard].Add(1)
		return true
	default:
		if s.h.full != nil {
			s.h.full.Inc()
		}
		return false
	}
}

// sendWait offers a sealed chunk to a shard queue, waiting until the
// queue takes it or timeout fires. Only a runner retrying a blocked batch
// waits, and never longer than its retry step.
func (s *sinkRuntime) sendWait(shard int, ch *chunk, timeout <-chan time.Time) bool {
	select {
	case s.queues[shard] <- ch:
		s.depth[shard].Add(1)
		return true
	case <-timeout:
		return false
	}
}

// AllBelow reports whether every shard queue holds at most
// floor(capacity × ratio) chunks.
func (s *sinkRuntime) AllBelow(ratio float64) bool {
	limit := int64(float64(s.opts.QueueCapacity) * ratio)
	for i := range s.depth {
		if s.depth[i].Load() > limit {
			return false
		}
	}
	return true
}

// closeQueues ends intake: call it once every chain that feeds the sink was
// closed. Writers then drain what is queued.
func (s *sinkRuntime) closeQueues() {
	s.closeOnce.Do(func() {
		for _, q := range s.queues {
			close(q)
		}
	})
}

// drain waits for the writers to write everything queued, until ctx's
// deadline; past it, the write under way is cancelled and the rest is
// abandoned (acknowledgments failed).
func (s *sinkRuntime) drain(ctx context.Context) DrainReport {
	s.draining.Store(true)
	before := s.flushed.Load()
	beforeAb := s.abandoned.Load()
	s.closeQueues()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	overran := false
	select {
	case <-done:
	case <-ctx.Done():
		overran = true
		s.abort()
		t := time.NewTimer(s.opts.AbortGrace)
		select {
		case <-done:
		case <-t.C:
			s.log.Error("sink writers did not stop within the abort grace; abandoning them")
		}
		t.Stop()
	}
	s.abort()
	// The chains are closed: the free chunks are for later runtimes. (A
	// writer abandoned past the abort grace holds only its own batch.)
	s.free.release()
	if overran {
		s.h.overrun.Inc()
	}
	return DrainReport{Flushed: s.flushed.Load() - before, Abandoned: s.abandoned.Load() - beforeAb, Overran: overran}
}

// stop aborts everything at once (a failed start, a hard stop).
func (s *sinkRuntime) stop() {
	s.abort()
	s.closeQueues()
	s.wg.Wait()
	s.free.release()
}

// Failure is why the sink last abandoned a batch, or "".
func (s *sinkRuntime) Failure() string {
	if p := s.lastFailure.Load(); p != nil {
		return *p
	}
	return ""
}

type sinkBatch struct {
	chunks  [][]Record
	held    []*chunk // the chunks themselves, recycled after the write
	records int
	bytes   int64
	acks    ackSet
}

// flat returns the batch's records as one slice: the only chunk's, or
// every chunk's copied into scratch (the writer's reused buffer).
func (b *sinkBatch) flat(scratch *[]Record) []Record {
	switch len(b.chunks) {
	case 0:
		return nil
	case 1:
		return b.chunks[0]
	}
	out := (*scratch)[:0]
	for _, c := range b.chunks {
		out = append(out, c...)
	}
	*scratch = out
	return out
}

// worker is a shard's intake: it takes chunks off the queue into a batch
// and hands the batch to the shard's writer once it is full or has
// lingered, so the queue keeps draining while a write is under way. A
// lingered batch that the writer is not free to take yet goes on taking
// chunks until the writer takes it, until it is full, or until it holds a
// queue's worth of chunks (QueueCapacity): a slow write makes the next
// batch bigger — one write and one durability barrier for all of it —
// instead of stalling the intake behind a small batch. A full batch, or a
// lingered one holding a queue's worth, waiting for the writer blocks the
// intake (backpressure): without that bound a sink slower than its source
// kept up to two batch caps in flight (with FileSink and the defaults,
// some 220 MB of chunks for a 100 MB run), each chunk allocated anew.
func (s *sinkRuntime) worker(shard int) {
	writes := make(chan *sinkBatch) // unbuffered: taken when the writer is free
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		var scratch []Record // Write's flattened records, reused
		for b := range writes {
			s.write(shard, b, &scratch)
		}
	}()
	defer func() {
		close(writes)
		<-writerDone
		s.wg.Done()
	}()
	bt := &shardBatcher{s: s, shard: shard, q: s.queues[shard], writes: writes, b: &sinkBatch{}}
	for bt.next() {
	}
}

// shardBatcher is the state of one shard's intake: the batch it is
// building, its linger timer, and whether the batch is due.
type shardBatcher struct {
	s      *sinkRuntime
	shard  int
	q      chan *chunk
	writes chan<- *sinkBatch
	b      *sinkBatch

	linger  *time.Timer
	lingerC <-chan time.Time
	// ready: the batch lingered (or the drain wants it out); it goes to the
	// writer as soon as the writer takes it.
	ready bool
}

// next serves one event of the intake: a chunk, the writer taking the due
// batch, the linger timer, or the abort. It returns false when the shard
// is done (its queue closed, or the work aborted).
func (bt *shardBatcher) next() bool {
	s := bt.s
	if s.workCtx.Err() != nil {
		bt.abort()
		return false
	}
	var send chan<- *sinkBatch // nil (never ready) unless the batch is due
	intake := bt.q
	if bt.ready {
		send = bt.writes
		if len(bt.b.held) >= s.opts.QueueCapacity {
			// Due, the writer busy, and a queue's worth taken in
			// already: leave the rest queued until the writer takes
			// this batch (backpressure), so that what a slow write
			// keeps in flight is bounded by the queue, not by the
			// batch caps.
			intake = nil
		}
	}
	select {
	case send <- bt.b:
		bt.ready = false
		bt.b = &sinkBatch{}
	case ch, ok := <-intake:
		if !ok {
			bt.flush()
			return false
		}
		bt.take(ch)
	case <-bt.lingerC:
		bt.linger, bt.lingerC = nil, nil
		bt.ready = true
	case <-s.workCtx.Done():
	}
	return true
}

// take adds a chunk to the batch, then hands a full batch over, marks it
// due at once while draining, or starts its linger.
func (bt *shardBatcher) take(ch *chunk) {
	s, b := bt.s, bt.b
	s.h.depth[bt.shard].Set(float64(s.depth[bt.shard].Add(-1)))
	b.chunks = append(b.chunks, ch.records)
	b.held = append(b.held, ch)
	b.records += len(ch.records)
	b.bytes += ch.bytes
	b.acks.Absorb(&ch.acks)
	switch {
	case b.records >= s.opts.BatchMaxRecords || b.bytes >= s.opts.BatchMaxBytes:
		bt.flush()
	case s.draining.Load():
		// Nothing to linger for while draining: out as soon as the
		// writer is free, with whatever is queued behind it by then.
		bt.stopLinger()
		bt.ready = true
	case bt.linger == nil && !bt.ready:
		bt.linger = time.NewTimer(s.opts.Linger)
		bt.lingerC = bt.linger.C
	}
}

func (bt *shardBatcher) stopLinger() {
	if bt.linger != nil {
		bt.linger.Stop()
		bt.linger, bt.lingerC = nil, nil
	}
}

// flush hands the batch over, waiting for the writer.
func (bt *shardBatcher) flush() {
	bt.stopLinger()
	bt.ready = false
	if bt.b.records == 0 && bt.b.acks.Len() == 0 {
		return
	}
	select {
	case bt.writes <- bt.b:
	case <-bt.s.workCtx.Done():
		bt.s.abandon(bt.b, "drain deadline reached")
	}
	bt.b = &sinkBatch{}
}

// abort abandons the batch and everything still queued.
func (bt *shardBatcher) abort() {
	bt.stopLinger()
	bt.s.abandon(bt.b, "drain deadline reached")
	for ch := range bt.q {
		bt.s.depth[bt.shard].Add(-1)
		bt.s.abandonChunk(ch)
	}
}

func (s *sinkRuntime) abandonChunk(ch *chunk) {
	s.budget.Sub(ch.bytes)
	ch.acks.Abandon()
	s.abandoned.Add(1)
	s.h.abandoned.Inc()
}

func (s *sinkRuntime) abandon(b *sinkBatch, why string) {
	if b.records == 0 && b.acks.Len() == 0 {
		return
	}
	s.budget.Sub(b.bytes)
	b.acks.Abandon()
	s.abandoned.Add(1)
	reason := fmt.Sprintf("sink %s abandoned a batch of %d records: %s", s.name, b.records, why)
	s.lastFailure.Store(&reason)
	s.h.abandoned.Inc()
	s.h.batchesAbandoned.Inc()
	s.recycle(b)
}

// chunkFreeList is a sink runtime's stack of free chunks. It hands out the
// chunk freed last, whose memory is likeliest still in cache, so the
// chunks in use stay as few as the chunks in flight need (a pool that
// hands out its oldest cycles through all it ever held). Past max chunks
// it spills into overflow, which outlives the runtime and lets the garbage
// collector have what stays unused.
type chunkFreeList struct {
	mu       sync.Mutex
	stack    []*chunk
	max      int
	overflow *sync.Pool
}

func (f *chunkFreeList) get() *chunk {
	f.mu.Lock()
	if n := len(f.stack); n > 0 {
		ch := f.stack[n-1]
		f.stack[n-1] = nil
		f.stack = f.stack[:n-1]
		f.mu.Unlock()
		return ch
	}
	f.mu.Unlock()
	if ch, ok := f.overflow.Get().(*chunk); ok {
		return ch
	}
	return nil
}

// release hands every stacked chunk to overflow, for the runtimes that
// come after this one.
func (f *chunkFreeList) release() {
	f.mu.Lock()
	stack := f.stack
	f.stack = nil
	f.mu.Unlock()
	for _, ch := range stack {
		f.overflow.Put(ch)
	}
}

func (f *chunkFreeList) put(ch *chunk) {
	f.mu.Lock()
	if len(f.stack) < f.max {
		f.stack = append(f.stack, ch)
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	f.overflow.Put(ch)
}

// chunkPools holds one chunk pool per chunk target size, shared by the
// process's sink runtimes: a pipeline that is rebuilt, or several that run
// side by side, reuse one another's chunks instead of each warming its own.
var chunkPools sync.Map // int64 → *sync.Pool

func chunkPool(target int64) *sync.Pool {
	if p, ok := chunkPools.Load(target); ok {
		return p.(*sync.Pool)
	}
	p, _ := chunkPools.LoadOrStore(target, new(sync.Pool))
	return p.(*sync.Pool)
}

// getChunk returns an empty chunk: a recycled one, or a new one whose
// arena holds the chunk target and whose record slice holds records.
func (s *sinkRuntime) getChunk(records int) *chunk {
	if ch := s.free.get(); ch != nil {
		return ch
	}
	t := s.opts.ChunkTargetBytes
	return &chunk{arena: make([]byte, 0, t+t/4), records: make([]Record, 0, records)}
}

// recycle returns a finished batch's chunks to the pool and empties b. It
// runs only once nothing can read the chunks any more: after the sink's
// write returned, or for a batch no write was handed. A chunk whose arena
// was outgrown (a huge record) is left to the garbage collector: its
// records may point into the older arena, and its arena is oversized.
func (s *sinkRuntime) recycle(b *sinkBatch) {
	for _, ch := range b.held {
		if ch.outgrown {
			continue
		}
		// The stale records point only into this chunk's own arena, which
		// is reused with it; they are overwritten before they are read.
		ch.records = ch.records[:0]
		ch.arena = ch.arena[:0]
		ch.bytes = 0
		ch.acks = ackSet{}
		s.free.put(ch)
	}
	*b = sinkBatch{}
}

// write writes b with retries and resolves its acknowledgments. scratch is
// the writer's buffer for flattening a batch for [Sink.Write].
func (s *sinkRuntime) write(shard int, b *sinkBatch, scratch *[]Record) {
	cs, chunked := s.sink.(ChunkedSink)
	var flat []Record
	if !chunked {
		flat = b.flat(scratch)
		if len(b.chunks) > 1 {
			// flat is the scratch buffer: drop its records' pointers once
			// written, since the buffer outlives the batch's arenas. (A
			// single chunk is lent as is and recycled with its batch.)
			defer clear(flat)
		}
	}
	backoff := s.opts.RetryInitial
	for attempt := 1; ; attempt++ {
		if s.workCtx.Err() != nil {
			s.abandon(b, "drain deadline reached")
			return
		}
		if fe := s.fatal.Load(); fe != nil {
			s.abandon(b, fe.Reason)
			return
		}
		start := time.Now()
		var err error
		if chunked {
			err = cs.WriteChunks(s.workCtx, shard, b.chunks)
		} else {
			err = s.sink.Write(s.workCtx, shard, flat)
		}
		s.h.writeDuration.Observe(time.Since(start).Seconds())
		if err == nil {
			s.budget.Sub(b.bytes)
			b.acks.Deliver()
			s.flushed.Add(1)
			s.h.batchesOK.Inc()
			s.h.records.Add(float64(b.records))
			s.recycle(b)
			return
		}
		if errors.Is(err, spate.ErrFatal) {
			s.log.Error("sink write failed fatally; abandoning the batch", "shard", shard, "error", err)
			s.abandon(b, err.Error())
			return
		}
		if s.opts.NoSpaceAttempts > 0 && attempt >= s.opts.NoSpaceAttempts && errors.Is(err, syscall.ENOSPC) {
			fe := s.noSpaceError(attempt, err)
			s.log.Error("sink out of space; failing the pipeline", "shard", shard, "attempts", attempt, "error", err)
			s.failFatal(fe)
			s.abandon(b, fe.Reason)
			return
		}
		if s.opts.MaxAttempts > 0 && attempt >= s.opts.MaxAttempts {
			s.log.Error("sink write retries exhausted; abandoning the batch", "shard", shard, "attempts", attempt, "error", err)
			s.abandon(b, fmt.Sprintf("%d attempts failed, last: %v", attempt, err))
			return
		}
		s.h.retries.Inc()
		s.log.Warn("sink write failed; retrying", "shard", shard, "attempt", attempt, "error", err)
		wait := time.Duration(float64(backoff) * (1 + s.opts.RetryJitter*(2*rand.Float64()-1)))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.workCtx.Done():
			t.Stop()
		case <-s.failed:
			t.Stop()
		}
		backoff = min(backoff*2, s.opts.RetryMax)
	}
}

// sinkHooks is what the runtime needs from its sinks. [newSinkHooks] builds it
// from sink runtimes; tests may supply their own.
type sinkHooks struct {
	// start launches the writers (called once by Run).
	start func(m *metrics, log *slog.Logger)
	// QueuesBelow reports whether every queue of every sink is at most
	// ratio full.
	QueuesBelow func(ratio float64) bool
	// Drain closes intake (every chain is closed by then) and writes what
	// is queued until ctx's deadline, then abandons the rest.
	Drain func(ctx context.Context) DrainReport
	// Stop aborts the sinks at once.
	Stop func()
	// Probe checks the sinks' connections; nil means always connected.
	Probe func(ctx context.Context) error
	// Failures describes why sinks last abandoned batches ("" if none).
	Failures func() string
	// Fatal is the first sink failed for good (nil: none, or no such
	// sinks); the controller fails the pipeline with it.
	Fatal func() *FatalError
}

// newSinkHooks combines sink runtimes into the runtime's hooks.
func newSinkHooks(rts ...*sinkRuntime) sinkHooks {
	h := sinkHooks{
		start: func(m *metrics, log *slog.Logger) {
			for _, s := range rts {
				s.start(m, log)
			}
		},
		QueuesBelow: func(ratio float64) bool {
			for _, s := range rts {
				if !s.AllBelow(ratio) {
					return false
				}
			}
			return true
		},
		Drain: func(ctx context.Context) DrainReport {
			var r DrainReport
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, s := range rts {
				wg.Go(func() {
					d := s.drain(ctx)
					mu.Lock()
					r.Flushed += d.Flushed
					r.Abandoned += d.Abandoned
					r.Overran = r.Overran || d.Overran
					mu.Unlock()
				})
			}
			wg.Wait()
			return r
		},
		Stop: func() {
			for _, s := range rts {
				s.stop()
			}
		},
		Failures: func() string {
			var out string
			for _, s := range rts {
				if f := s.Failure(); f != "" {
					if out != "" {
						out += "; "
					}
					out += f
				}
			}
			return out
		},
		Fatal: func() *FatalError {
			for _, s := range rts {
				if fe := s.Fatal(); fe != nil {
					return fe
				}
			}
			return nil
		},
	}
	var probers []SinkProber
	for _, s := range rts {
		if p, ok := s.sink.(SinkProber); ok {
			probers = append(probers, p)
		}
	}
	if len(probers) > 0 {
		h.Probe = func(ctx context.Context) error {
			for _, p := range probers {
				if err := p.Probe(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return h
}
