package pgsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Source reads a table: it is both the job's [spate.SplitPlanner] (one
// split per chunk) and its [pipeline.SplitSource]:
//
//	src, err := pgsource.New(ctx, pgsource.Options{URL: url, Table: "events"})
//	pipeline.NewCoordinatedSource(coord, src, src)
type Source struct {
	pipeline.BaseSplitSource
	opts  Options
	table *Table
	cfg   *pgx.ConnConfig

	// free is the memory of rows the runtime is done with, for the
	// chunks' readers to fill again: batches read into fresh megabytes
	// cost page faults and the GC's time.
	free chan arena

	mu        sync.Mutex
	lanes     map[spate.SplitID]*lane
	finishing []spate.SplitID

	// idle are connections of chunks read to their end, for the next
	// chunks' reads: a new connection costs 15-100 ms (a server process
	// forked, authentication). Each is closed after idleConnTime unused.
	idleMu sync.Mutex
	idle   []*idleConn
	closed bool
}

type idleConn struct {
	c     *pgx.Conn
	timer *time.Timer
}

const (
	// maxIdleConns caps the connections a source keeps idle.
	maxIdleConns = 4
	// idleConnTime is how long an idle connection is kept.
	idleConnTime = 5 * time.Second
)

// conn is a connection for a chunk's read: an idle one, or a new one.
func (s *Source) conn(ctx context.Context) (*pgx.Conn, error) {
	s.idleMu.Lock()
	for len(s.idle) > 0 {
		ic := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		// Whoever takes a connection out of idle owns it: its timer finds
		// it gone.
		ic.timer.Stop()
		s.idleMu.Unlock()
		// One round trip, not a new connection's several: a connection the
		// server ended while idle is not handed to a read.
		if !ic.c.IsClosed() && ic.c.Ping(ctx) == nil {
			return ic.c, nil
		}
		_ = ic.c.Close(context.Background())
		s.idleMu.Lock()
	}
	s.idleMu.Unlock()
	return pgx.ConnectConfig(ctx, s.cfg)
}

// put gives back c after a read: kept idle if reuse (the read ended
// cleanly) and there is room, closed otherwise.
func (s *Source) put(c *pgx.Conn, reuse bool) {
	s.idleMu.Lock()
	if reuse && !s.closed && len(s.idle) < maxIdleConns && !c.IsClosed() {
		ic := &idleConn{c: c}
		ic.timer = time.AfterFunc(idleConnTime, func() {
			s.idleMu.Lock()
			i := slices.Index(s.idle, ic)
			if i >= 0 {
				s.idle = slices.Delete(s.idle, i, i+1)
			}
			s.idleMu.Unlock()
			if i >= 0 {
				_ = c.Close(context.Background())
			}
		})
		s.idle = append(s.idle, ic)
		s.idleMu.Unlock()
		return
	}
	s.idleMu.Unlock()
	_ = c.Close(context.Background())
}

// dropIdle closes the idle connections: a read failed, so they may be
// broken as its connection was.
func (s *Source) dropIdle() {
	s.idleMu.Lock()
	idle := s.idle
	s.idle = nil
	s.idleMu.Unlock()
	for _, ic := range idle {
		ic.timer.Stop()
		_ = ic.c.Close(context.Background())
	}
}

// Close closes the connections the source keeps idle; reads that end
// later close theirs. The source's splits should be closed first (the
// runtime has ended).
func (s *Source) Close() error {
	// Once closed, put keeps no connection idle: dropIdle closes the last.
	s.idleMu.Lock()
	s.closed = true
	s.idleMu.Unlock()
	s.dropIdle()
	return nil
}

var (
	_ spate.SplitPlanner   = (*Source)(nil)
	_ pipeline.SplitSource = (*Source)(nil)
)

// New checks o against the server (see [Describe]) and returns the source.
func New(ctx context.Context, o Options) (*Source, error) {
	if o.ChunkRows <= 0 {
		o.ChunkRows = DefaultChunkRows
	}
	if o.MaxRowBytes <= 0 {
		o.MaxRowBytes = DefaultMaxRowBytes
	}
	cfg, err := connConfig(o.URL)
	if err != nil {
		return nil, err
	}
	c, err := Connect(ctx, o.URL)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	t, err := Describe(ctx, c, o)
	if err != nil {
		return nil, err
	}
	if err := checkWhere(ctx, c, t, o.Where); err != nil {
		return nil, err
	}
	return &Source{opts: o, table: t, cfg: cfg, lanes: map[spate.SplitID]*lane{}, free: make(chan arena, freeArenas)}, nil
}

// freeArenas is how many batches' memory a source keeps for reuse.
const freeArenas = 16

// Table is what New found.
func (s *Source) Table() *Table { return s.table }

// PackRows sets [Options.PackRows]: whether a record carries many rows.
// Call it before the source opens a split (before the runtime runs).
func (s *Source) PackRows(on bool) { s.opts.PackRows = on }

// Fingerprint implements [spate.SplitPlanner]: the table, key, columns,
// filter and chunk size (never the URL, which may hold a password).
func (s *Source) Fingerprint() string {
	b, _ := json.Marshal(struct {
		T, K string
		C    []Column
		W    string
		N    int64
	}{s.table.Name, s.table.Key, s.table.Columns, s.opts.Where, s.opts.ChunkRows})
	return "pgsource:v1:" + string(b)
}

// chunk is a split's descriptor: keys in (Lo, Hi], nil for no bound.
type chunk struct {
	Lo *string `json:"lo,omitempty"`
	Hi *string `json:"hi,omitempty"`
}

// Plan implements [spate.SplitPlanner]: chunk ends found by probing the
// key's index, ChunkRows rows at a time. The plan is final.
func (s *Source) Plan(ctx context.Context, _ spate.PlanContext) (spate.SplitPlan, error) {
	c, err := pgx.ConnectConfig(ctx, s.cfg)
	if err != nil {
		return spate.SplitPlan{}, spate.Retryablef("pgsource: plan %s: connect: %v", s.table.Name, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	chunks, err := s.probe(ctx, c)
	if err != nil {
		return spate.SplitPlan{}, spate.Retryablef("pgsource: plan %s: %v", s.table.Name, err)
	}
	var out []spate.PlannedSplit
	for i, ch := range chunks {
		desc, err := json.Marshal(ch.chunk)
		if err != nil {
			return spate.SplitPlan{}, err
		}
		id := spate.MustSplitID(fmt.Sprintf("chunk-%06d", i))
		// The weight is the chunk's rows as planned, so the weights sum to
		// the table's rows: the progress line shows them as rows. The
		// open-ended last chunk (keys above the last probed end, for rows
		// inserted later) may hold none; the assignment counts 0 as 1.
		out = append(out, spate.NewPlannedSplit(spate.NewSplitSpec(id, desc).WithWeight(uint64(ch.rows))))
	}
	return spate.NewSplitPlan(out, spate.PlanFinal), nil
}

type probed struct {
	chunk
	rows int64
}

// probe walks the key in ChunkRows steps.
func (s *Source) probe(ctx context.Context, c *pgx.Conn) ([]probed, error) {
	t, k := s.table, ident(s.table.Key)
	var out []probed
	var lo *string
	for {
		var conds []string
		var args []any
		if lo != nil {
			conds = append(conds, k+" > $1::"+t.KeyType)
			args = append(args, *lo)
		}
		// The ChunkRows-th key after lo: an index-only scan that skips the
		// keys before it, and only that one key made text (max() does not
		// exist for every rangeable type: uuid).
		from := t.Name + bounded(conds, s.opts.Where)
		var hi *string
		err := c.QueryRow(ctx, "SELECT "+k+"::text FROM (SELECT "+k+" FROM "+from+" ORDER BY "+k+
			" OFFSET "+strconv.FormatInt(s.opts.ChunkRows-1, 10)+" LIMIT 1) s", args...).Scan(&hi)
		if errors.Is(err, pgx.ErrNoRows) {
			// Fewer than ChunkRows left: the last chunk, with no upper
			// bound.
			var n int64
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+from, args...).Scan(&n); err != nil {
				return nil, err
			}
			return append(out, probed{chunk{Lo: lo}, n}), nil
		}
		if err != nil {
			return nil, err
		}
		n := s.opts.ChunkRows
		out = append(out, probed{chunk{Lo: lo, Hi: hi}, n})
		lo = hi
	}
}

// state encodes a resume key; the prefix tells an empty key from none.
func state(key string) []byte { return append([]byte{'k'}, key...) }

func parseState(b []byte) (string, bool) {
	if len(b) == 0 || b[0] != 'k' {
		return "", false
	}
	return string(b[1:]), true
}

// ValidateResume implements [pipeline.SplitSource]: progress past the
// chunk's start must carry the last key read.
func (s *Source) ValidateResume(spec spate.SplitSpec, p spate.SplitProgress) error {
	if _, err := parseChunk(spec); err != nil {
		return err
	}
	if _, ok := parseState(p.State); p.Watermark > 0 && !ok {
		return fmt.Errorf("pgsource: split %s of %s: committed progress at row %d carries no key to resume after (not this source's progress)", spec.ID, s.table.Name, p.Watermark)
	}
	return nil
}

func parseChunk(spec spate.SplitSpec) (chunk, error) {
	var ch chunk
	if err := json.Unmarshal(spec.Descriptor, &ch); err != nil {
		return ch, fmt.Errorf("pgsource: split %s: descriptor %q is not a chunk: %v", spec.ID, spec.Descriptor, err)
	}
	return ch, nil
}

// OpenSplit implements [pipeline.SplitSource]: the lane starts reading at
// once, after the committed key if any.
func (s *Source) OpenSplit(o pipeline.SplitOpening) (pipeline.Lane, error) {
	ch, err := parseChunk(o.Spec)
	if err != nil {
		return nil, err
	}
	l := &lane{src: s, split: o.Spec.ID, id: o.Lane, part: o.Partition, issuer: o.Issuer,
		poison: o.Poison, waker: o.Waker, chunk: ch, weight: o.Spec.Weight}
	if o.Progress != nil && o.Progress.Watermark > 0 {
		key, _ := parseState(o.Progress.State)
		l.lastKey = &key
		l.next = o.Progress.Watermark
		l.committedState = o.Progress.State
	}
	l.resumedAt, l.committed = l.next, l.next
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.start()
	s.mu.Lock()
	s.lanes[o.Spec.ID] = l
	s.mu.Unlock()
	return l, nil
}

func (s *Source) lane(split spate.SplitID) *lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lanes[split]
}

// EncodeCommit implements [pipeline.SplitSource]: the progress carries the
// key of the row at watermark-1.
func (s *Source) EncodeCommit(split spate.SplitID, watermark int64) (spate.SplitProgress, error) {
	l := s.lane(split)
	if l == nil {
		return spate.SplitProgress{}, spate.Fatalf("pgsource: commit of split %s, which this worker does not read", split)
	}
	return l.encode(watermark)
}

// Sweep implements [pipeline.SplitSource]: a chunk read to its end whose
// every row is committed completes.
func (s *Source) Sweep(split spate.SplitID) (*spate.SplitProgress, error) {
	l := s.lane(split)
	if l == nil {
		return nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done && l.committed >= l.next {
		p := spate.CompletedProgress(l.next, l.committedState)
		return &p, nil
	}
	return nil, nil
}

// CloseSplit implements [pipeline.SplitSource]: the chunk's read stops.
func (s *Source) CloseSplit(split spate.SplitID) {
	s.mu.Lock()
	l := s.lanes[split]
	delete(s.lanes, split)
	s.mu.Unlock()
	if l != nil {
		l.cancel()
	}
}

// TakeFinishing implements [pipeline.SplitSource].
func (s *Source) TakeFinishing() []spate.SplitID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.finishing
	s.finishing = nil
	return out
}

func (s *Source) finished(split spate.SplitID) {
	s.mu.Lock()
	s.finishing = append(s.finishing, split)
	s.mu.Unlock()
}
