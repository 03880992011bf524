package pipeline

import (
	"fmt"
	"time"
)

// pushKind says how a push or flush ended.
type pushKind uint8

const (
	// pushDone: everything was accepted.
	pushDone pushKind = iota
	// pushBlocked: the chain cannot take more now; push again from
	// ResumeAt after a short wait. Payloads before ResumeAt were processed
	// and never run again.
	pushBlocked
	// pushFatal: the chain failed for good; Err says why.
	pushFatal
)

// blockReason says why a chain is blocked.
type blockReason uint8

const (
	// blockCapacity: a sink queue is full (counts as backpressure).
	blockCapacity blockReason = iota
	// blockNotReady: a stage is not ready (does not count as backpressure).
	blockNotReady
)

// pushOutcome is the result of [runnerChain.PushBatch] and [runnerChain.Flush].
type pushOutcome struct {
	Kind     pushKind
	ResumeAt int
	Reason   blockReason
	Err      *FatalError
}

// runnerChain is one runner's operator chain: it takes polled batches through
// the transform stages into the sink queues. A chain is owned by one runner
// goroutine and never shared.
//
// Acknowledgments: the runtime keeps the batch's own reference and
// releases it after the push; a chain that keeps any of the batch's data
// beyond the call (a partial chunk, a queued chunk) must hold a reference of
// its own for it ([AckRef.Clone], [ackSet]) and must fail it if that data
// is dropped.
type runnerChain interface {
	// PushBatch pushes b's payloads from index from on. It must not block
	// on a full queue: it parks the data and reports Blocked.
	PushBatch(b *Batch, from int) pushOutcome
	// Flush seals and sends partial output. Blocked means some of it is
	// still parked.
	Flush() pushOutcome
	// AbandonBatch forgets the current batch's resume state: its ack was
	// failed and its data replays.
	AbandonBatch()
	// Close tears the chain down; every acknowledgment it still holds
	// fails. Called once, by the runner that owns the chain.
	Close()
}

// roomWaiter is implemented by chains that can wait for a full sink queue
// to take their first parked chunk; the runner then retries a blocked batch
// the moment there is room instead of sleeping.
type roomWaiter interface {
	// waitRoom sends the first parked chunk, waiting up to max for its
	// queue to take it. It reports whether the chunk went.
	waitRoom(max time.Duration) bool
}

// chainFactory builds the chain of runner thread i.
type chainFactory func(thread int) runnerChain

// Record is a record inside a chain: the payload as the stages see and
// rewrite it.
type Record struct {
	Key         []byte
	Value       []byte
	Partition   PartitionID
	Offset      int64
	TimestampMs int64
}

// ErrorPolicy decides what a stage error does to its record.
type ErrorPolicy uint8

const (
	// Fail stops the pipeline: the batch's acknowledgment fails, so its
	// data replays after the restart. Counted in
	// spate_transform_record_errors_total{policy="fail"}.
	Fail ErrorPolicy = iota
	// Skip drops the record and carries on; a dropped record counts as
	// delivered. Counted in spate_transform_record_errors_total{policy="skip"}.
	Skip
)

func (p ErrorPolicy) String() string {
	if p == Skip {
		return "skip"
	}
	return "fail"
}

// Stage is one transform step of a chain.
type Stage struct {
	name   string
	policy ErrorPolicy
	apply  func(r Record, emit func(Record)) error
}

// Name is the stage's name (its metric label).
func (s Stage) Name() string { return s.name }

// Map rewrites every record.
func Map(name string, policy ErrorPolicy, fn func(Record) (Record, error)) Stage {
	return Stage{name: name, policy: policy, apply: func(r Record, emit func(Record)) error {
		out, err := fn(r)
		if err != nil {
			return err
		}
		emit(out)
		return nil
	}}
}

// Filter keeps the records fn accepts; a dropped record counts as
// delivered.
func Filter(name string, policy ErrorPolicy, fn func(Record) (bool, error)) Stage {
	return Stage{name: name, policy: policy, apply: func(r Record, emit func(Record)) error {
		keep, err := fn(r)
		if err != nil {
			return err
		}
		if keep {
			emit(r)
		}
		return nil
	}}
}

// FlatMap emits zero or more records per record.
func FlatMap(name string, policy ErrorPolicy, fn func(r Record, emit func(Record)) error) Stage {
	return Stage{name: name, policy: policy, apply: fn}
}

// standardChain runs the stages and fans every surviving record out to
// one terminal per sink.
type standardChain struct {
	stages    []Stage
	terminals []*terminal
	errs      []stageErrCounters
	ack       *AckRef
	fatal     *FatalError
	emitAt    []func(Record) // emitAt[i] feeds stage i; emitAt[len] feeds the terminals
	timer     *time.Timer    // waitRoom's, reused
}

type stageErrCounters struct{ skip, fail interface{ Inc() } }

// newChainFactory returns a factory of chains that run stages and write to
// every sink runtime (fan-out: each sink gets every record).
func newChainFactory(stages []Stage, sinks ...*sinkRuntime) chainFactory {
	return func(int) runnerChain { return newStandardChain(stages, sinks) }
}

func newStandardChain(stages []Stage, sinks []*sinkRuntime) *standardChain {
	c := &standardChain{stages: stages}
	for _, s := range sinks {
		c.terminals = append(c.terminals, s.newTerminal())
	}
	for _, st := range stages {
		var m *metrics
		if len(sinks) > 0 {
			m = sinks[0].m()
		}
		var ctr stageErrCounters
		if m != nil {
			ctr.skip = m.recordErrors.WithLabelValues("transform", "transform", st.name, "skip")
			ctr.fail = m.recordErrors.WithLabelValues("transform", "transform", st.name, "fail")
		}
		c.errs = append(c.errs, ctr)
	}
	c.emitAt = make([]func(Record), len(stages)+1)
	c.emitAt[len(stages)] = func(r Record) {
		for _, t := range c.terminals {
			t.add(r.Key, r.Value, r.Partition, r.Offset, r.TimestampMs, c.ack)
		}
	}
	for i := len(stages) - 1; i >= 0; i-- {
		next := c.emitAt[i+1]
		st := stages[i]
		ctr := c.errs[i]
		c.emitAt[i] = func(r Record) {
			if c.fatal != nil {
				return
			}
			if err := st.apply(r, next); err != nil {
				if st.policy == Skip {
					if ctr.skip != nil {
						ctr.skip.Inc()
					}
					return
				}
				if ctr.fail != nil {
					ctr.fail.Inc()
				}
				c.fatal = fatalf("transform:"+st.name, "record at partition %d offset %d: %v", r.Partition, r.Offset, err)
			}
		}
	}
	return c
}

func (c *standardChain) blocked() bool {
	for _, t := range c.terminals {
		if t.blocked() {
			return true
		}
	}
	return false
}

func (c *standardChain) unpark() bool {
	ok := true
	for _, t := range c.terminals {
		if !t.unpark() {
			ok = false
		}
	}
	return ok
}

func (c *standardChain) PushBatch(b *Batch, from int) pushOutcome {
	if c.fatal != nil {
		return pushOutcome{Kind: pushFatal, Err: c.fatal}
	}
	if !c.unpark() {
		return pushOutcome{Kind: pushBlocked, ResumeAt: from, Reason: blockCapacity}
	}
	if len(c.stages) == 0 {
		return c.pushDirect(b, from)
	}
	c.ack = b.Ack
	defer func() { c.ack = nil }()
	emit := c.emitAt[0]
	for i := from; i < len(b.Payloads); i++ {
		p := &b.Payloads[i]
		emit(Record{Key: p.Key, Value: p.Value, Partition: p.Partition, Offset: p.Offset, TimestampMs: p.TimestampMs})
		if c.fatal != nil {
			return pushOutcome{Kind: pushFatal, Err: c.fatal}
		}
		if c.blocked() {
			return pushOutcome{Kind: pushBlocked, ResumeAt: i + 1, Reason: blockCapacity}
		}
	}
	return pushOutcome{Kind: pushDone}
}

// pushDirect is PushBatch's fast path for a chain without stages: every
// payload is copied straight into the terminals' chunks, with no record
// built and no closure called per record.
func (c *standardChain) pushDirect(b *Batch, from int) pushOutcome {
	ps := b.Payloads
	if len(c.terminals) == 1 {
		t := c.terminals[0]
		if n := t.addRun(ps, from, b.Ack); t.blocked() {
			return pushOutcome{Kind: pushBlocked, ResumeAt: n, Reason: blockCapacity}
		}
		return pushOutcome{Kind: pushDone}
	}
	for i := from; i < len(ps); i++ {
		p := &ps[i]
		for _, t := range c.terminals {
			t.add(p.Key, p.Value, p.Partition, p.Offset, p.TimestampMs, b.Ack)
		}
		if c.blocked() {
			return pushOutcome{Kind: pushBlocked, ResumeAt: i + 1, Reason: blockCapacity}
		}
	}
	return pushOutcome{Kind: pushDone}
}

func (c *standardChain) Flush() pushOutcome {
	if c.fatal != nil {
		return pushOutcome{Kind: pushFatal, Err: c.fatal}
	}
	for _, t := range c.terminals {
		t.sealAll()
	}
	if !c.unpark() {
		return pushOutcome{Kind: pushBlocked, Reason: blockCapacity}
	}
	return pushOutcome{Kind: pushDone}
}

func (c *standardChain) AbandonBatch() { c.ack = nil }

func (c *standardChain) waitRoom(max time.Duration) bool {
	for _, t := range c.terminals {
		if !t.blocked() {
			continue
		}
		if c.timer == nil {
			c.timer = time.NewTimer(max)
		} else {
			c.timer.Reset(max)
		}
		ok := t.sendFirstWait(c.timer.C)
		c.timer.Stop()
		return ok
	}
	return true
}

func (c *standardChain) Close() {
	for _, t := range c.terminals {
		t.close()
	}
}

// chunk is a run of records bound for one sink shard, with a reference to
// every batch it holds data of.
type chunk struct {
	records []Record
	arena   []byte
	bytes   int64
	acks    ackSet
	// outgrown: a record did not fit the arena, which was reallocated, so
	// earlier records point into the old one (the chunk is not recycled).
	outgrown bool
}

// terminal is one chain's end toward one sink: per-shard chunks being
// filled, and the sealed chunks a full queue refused (parked, in order).
type terminal struct {
	s       *sinkRuntime
	current []*chunk
	parked  []*chunk // FIFO across shards; each chunk knows its shard
	shardOf map[*chunk]int
	// lastRecords is, per shard, how many records the last sealed chunk
	// held: the next chunk's record slice starts that large, so a chunk of
	// small records is not grown (and copied) a dozen times.
	lastRecords []int
}

// add copies one record into its shard's chunk, sealing the chunk once it
// reaches the target size. It reports whether it sealed one.
func (t *terminal) add(key, value []byte, p PartitionID, off, ts int64, ack *AckRef) bool {
	shard := 0
	if len(t.current) > 1 {
		shard = int(uint32(p) % uint32(len(t.current)))
	}
	ch := t.current[shard]
	if ch == nil {
		ch = t.open(shard)
	}
	// Copy into the arena: the lane may reuse the payload's memory.
	start := len(ch.arena)
	if start+len(key)+len(value) > cap(ch.arena) {
		ch.outgrown = true
	}
	ch.arena = append(ch.arena, key...)
	ch.arena = append(ch.arena, value...)
	ch.records = append(ch.records, Record{Partition: p, Offset: off, TimestampMs: ts})
	r := &ch.records[len(ch.records)-1]
	if key != nil {
		r.Key = ch.arena[start : start+len(key) : start+len(key)]
	}
	vs := start + len(key)
	r.Value = ch.arena[vs : vs+len(value) : vs+len(value)]
	ch.bytes += int64(len(key) + len(value) + recordOverhead)
	if ack != nil {
		ch.acks.AddOnce(ack)
	}
	if ch.bytes >= t.s.opts.ChunkTargetBytes {
		t.seal(shard)
		return true
	}
	return false
}

// addRun adds ps[from:] and returns the index after the last payload it
// added: len(ps), or earlier when a sealed chunk stayed parked (a full
// queue), the chain's cue to report Blocked. It is add for a run of
// payloads: each stretch of one partition is copied into its chunk with the
// chunk's slices held in locals, the batch's reference taken once.
func (t *terminal) addRun(ps []RawPayload, from int, ack *AckRef) int {
	target := t.s.opts.ChunkTargetBytes
	i := from
	for i < len(ps) {
		part := ps[i].Partition
		shard := 0
		if len(t.current) > 1 {
			shard = int(uint32(part) % uint32(len(t.current)))
		}
		ch := t.current[shard]
		if ch == nil {
			ch = t.open(shard)
		}
		if ack != nil {
			ch.acks.AddOnce(ack)
		}
		recs, arena, bytes := ch.records, ch.arena, ch.bytes
		outgrown := false
		for i < len(ps) && bytes < target {
			p := &ps[i]
			if p.Partition != part {
				break
			}
			i++
			start := len(arena)
			if start+len(p.Key)+len(p.Value) > cap(arena) {
				outgrown = true
			}
			arena = append(arena, p.Key...)
			arena = append(arena, p.Value...)
			// Fill the record in place, field by field: no record is built
			// elsewhere and copied (72 bytes, through a write barrier).
			n := len(recs)
			if n < cap(recs) {
				recs = recs[:n+1]
			} else {
				recs = append(recs, Record{})
			}
			r := &recs[n]
			if p.Key != nil {
				r.Key = arena[start : start+len(p.Key) : start+len(p.Key)]
			} else {
				r.Key = nil
			}
			vs := start + len(p.Key)
			r.Value = arena[vs : vs+len(p.Value) : vs+len(p.Value)]
			r.Partition, r.Offset, r.TimestampMs = part, p.Offset, p.TimestampMs
			bytes += int64(len(p.Key) + len(p.Value) + recordOverhead)
		}
		ch.records, ch.arena, ch.bytes = recs, arena, bytes
		ch.outgrown = ch.outgrown || outgrown
		if bytes >= target {
			t.seal(shard)
			if t.blocked() {
				return i
			}
		}
	}
	return len(ps)
}

// open starts a shard's next chunk, its record slice sized from the last
// sealed chunk's count when the pool has none to give.
func (t *terminal) open(shard int) *chunk {
	n := 128
	if shard < len(t.lastRecords) {
		n = max(n, t.lastRecords[shard]+t.lastRecords[shard]/8)
	}
	ch := t.s.getChunk(n)
	t.current[shard] = ch
	return ch
}

// recordOverhead is the per-record framing counted against the budget.
const recordOverhead = 16

func (t *terminal) seal(shard int) {
	ch := t.current[shard]
	if ch == nil || len(ch.records) == 0 {
		return
	}
	t.current[shard] = nil
	if shard < len(t.lastRecords) {
		t.lastRecords[shard] = len(ch.records)
	}
	t.s.budget.Add(ch.bytes)
	t.shardOf[ch] = shard
	t.parked = append(t.parked, ch)
	t.unpark()
}

func (t *terminal) sealAll() {
	for i := range t.current {
		t.seal(i)
	}
}

// unpark sends parked chunks in order until a queue refuses one. It reports
// whether nothing is left parked.
func (t *terminal) unpark() bool {
	for len(t.parked) > 0 {
		ch := t.parked[0]
		shard := t.shardOf[ch]
		if !t.s.trySend(shard, ch) {
			return false
		}
		delete(t.shardOf, ch)
		t.parked[0] = nil
		t.parked = t.parked[1:]
	}
	t.parked = nil
	return true
}

// sendFirstWait sends the first parked chunk, waiting until its queue takes
// it or timeout fires.
func (t *terminal) sendFirstWait(timeout <-chan time.Time) bool {
	ch := t.parked[0]
	if !t.s.sendWait(t.shardOf[ch], ch, timeout) {
		return false
	}
	delete(t.shardOf, ch)
	t.parked[0] = nil
	t.parked = t.parked[1:]
	if len(t.parked) == 0 {
		t.parked = nil
	}
	return true
}

func (t *terminal) blocked() bool { return len(t.parked) > 0 }

func (t *terminal) close() {
	for i, ch := range t.current {
		if ch != nil {
			ch.acks.Abandon()
			t.current[i] = nil
		}
	}
	for _, ch := range t.parked {
		ch.acks.Abandon()
		t.s.budget.Sub(ch.bytes)
	}
	t.parked = nil
	clear(t.shardOf)
}

func (o pushOutcome) String() string {
	switch o.Kind {
	case pushDone:
		return "done"
	case pushBlocked:
		return fmt.Sprintf("blocked(at %d)", o.ResumeAt)
	}
	return fmt.Sprintf("fatal(%v)", o.Err)
}
