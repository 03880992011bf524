// Package pgsink is an exactly-once PostgreSQL sink, fenced in the
// database: a [pipeline.StagingSink] that needs no prepared transactions,
// no server setting and no primary key on the destination.
//
// A fence table (spate_fence by default, created if absent) holds one row
// per job and split: the lease epoch of the split's current writer, and the
// split's watermark as far as the destination table has it. Each flush (a
// commit's Prepare) is one transaction:
//
//	SELECT epoch, watermark FROM spate_fence
//	  WHERE job = $j AND split = $s FOR UPDATE         -- a later epoch: a zombie, roll back
//	UPDATE spate_fence SET epoch = $e, watermark = $w, last_key = $k WHERE ...
//	COPY dest (cols) FROM STDIN                         -- the rows below $w it lacks
//	COMMIT
//
// within half the lease (Options.Lease): a flush blocked in the database
// ends, rolled back, before the tenancy can.
//
// A new owner first takes the fence at its own, higher epoch (which shuts
// the old owner out: its next flush updates no row and rolls back, writing
// nothing) and reads the watermark the table holds. That watermark may be
// ahead of the job's committed one (an owner that flushed and died before
// its store commit): the rows the source reads again below it are already
// in the table and are dropped, and the row just below it must carry the
// key the fence recorded, or the sink refuses to go on (the chunk changed
// under the job). The database, not the store, holds the sink's watermark;
// the committable in the store only records it (see
// docs/decisions/037-a-database-sink-fences-in-the-database.md).
//
// Rows are flushed ahead of the commit, in the background: once a
// quarter of FlushBytes is staged, a Write starts a fenced transaction of
// their own in a goroutine and goes on staging while it runs (the table
// runs ahead of the store, as above); reading and writing overlap. Memory
// is bounded: a Write that brings a split's staged rows (those being
// flushed included) to FlushBytes waits for the flush running. A row over
// MaxRowBytes fails its batch with nothing written
// (docs/decisions/042-the-database-sink-flushes-ahead-of-the-commit.md).
//
// Rows are taken as the pgsource package produces them: a record's Value
// is the row in COPY text format, its Key the key's text. A record may
// carry many rows (pgsource.Options.PackRows): its Value their lines and
// its Key their keys, each joined by '\n', its Offset the last row's; the
// sink then stages and copies the lines as they are, a batch at a time.
package pgsink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsource"
)

// DefaultFenceTable is the fence table's name.
const DefaultFenceTable = "spate_fence"

// Options say where to write.
type Options struct {
	// URL is the destination server's connection URL.
	URL string
	// Table is the destination table, optionally schema-qualified. It needs
	// no primary key.
	Table string
	// Job names the job in the fence table: a destination table takes the
	// output of one job.
	Job string
	// Columns are the destination columns written, in the rows' order.
	// Default: Shape's names, or else all of the table's columns.
	Columns []string
	// Shape, when set, is the source's columns (pgsource.Source.Table's
	// Columns): the destination must have each, by name, of the same type.
	Shape []pgsource.Column
	// FenceTable is the fence table. Default [DefaultFenceTable].
	FenceTable string
	// MaxConns caps the sink's connections (flushes of different splits run
	// at once). Default 4.
	MaxConns int
	// FlushBytes caps the rows a split's tenancy holds in memory. Once a
	// quarter of it is staged, Write starts a flush of them in a fenced
	// transaction of their own, ahead of the commit, in the background
	// (the table's watermark in the fence row moves on; the next commit
	// records it); a flush that fails is reported by the tenancy's next
	// Write and its rows are tried again. A Write that brings the staged
	// rows to FlushBytes waits for the flush running. A transaction so
	// writes at most FlushBytes plus one row, and the sink holds at most
	// that per split it writes. Default [DefaultFlushBytes].
	FlushBytes int
	// MaxRowBytes caps one row (a record's Value): a longer row fails the
	// pipeline, naming the table, the split and the row's key, and nothing
	// of its batch is written. Default [DefaultMaxRowBytes], the source's
	// default cap: raise both together.
	MaxRowBytes int
	// Lease is the job's lease (spate.Config.LeaseDuration): a flush is
	// given at most half of it, so that one blocked in the database (by
	// another session's lock, a stalled server) ends, rolled back, before
	// the tenancy's lease can: a lease renewed a third of a lease ago
	// still has two thirds left when the flush starts. Its transaction
	// runs with statement_timeout set to that, and the client cancels it
	// then too. A flush that runs out of time fails retryably, having
	// written nothing. Default [spate.DefaultLeaseDuration].
	Lease time.Duration
}

// DefaultFlushBytes is the default [Options.FlushBytes].
const DefaultFlushBytes = 4 << 20

// DefaultMaxRowBytes is the default [Options.MaxRowBytes]: pgsource's.
const DefaultMaxRowBytes = pgsource.DefaultMaxRowBytes

// Sink is the exactly-once PostgreSQL sink.
type Sink struct {
	o     Options
	cfg   *pgx.ConnConfig
	dest  string // quoted, schema-qualified
	fence string // quoted
	cols  []string
	copy  string // the COPY statement

	poolMu sync.Mutex
	idle   []*pgx.Conn
	open   int
	slots  chan struct{}

	mu      sync.Mutex
	stages  map[pipeline.PartitionID]*stage
	retired map[pipeline.PartitionID]bool // tenancies ended: their late records are dropped

	ahead sync.WaitGroup // flushes ahead of the commit, running in the background
}

var (
	_ pipeline.StagingSink = (*Sink)(nil)
	_ pipeline.ChunkedSink = (*Sink)(nil)
)

type stage struct {
	t pipeline.StageTenancy
	// ctx is the tenancy's, for its flushes ahead of the commit:
	// CloseStage ends it.
	ctx    context.Context
	cancel context.CancelFunc

	// flushing serializes the tenancy's flushes: Prepare's (the
	// controller) and those ahead of the commit, which a Write starts and
	// a goroutine of their own runs (unlocking it when done).
	flushing sync.Mutex

	mu sync.Mutex
	// skipBelow is the table's watermark when the tenancy began: rows
	// below it are in the table already. checkKey is the key of the row
	// at skipBelow-1, as the fence recorded it.
	skipBelow int64
	checkKey  *string
	checked   bool
	next      int64       // the offset after the last row staged or skipped: a retried Write's rows below it are dropped
	buf       []byte      // staged rows, each ending in '\n'
	keys      []byte      // their keys, back to back
	rows      []stagedRow // their offsets and ends in buf and keys
	flushed   int64       // the table's watermark as this tenancy knows it
	fenced    bool        // a flush found a later epoch in the fence: rows are dropped
	inflight  int         // the bytes at buf's start a flush is writing
	aheadErr  error       // a flush ahead of the commit failed: the next Write reports it
}

// stagedRow is a record staged: one row, or the rows of a packed one.
type stagedRow struct {
	first, offset int64 // the first row's offset and the last's
	end           int   // end of the rows in buf
	kstart, kend  int   // the last row's key in keys
}

// committable is what a commit's Output records: the watermark committed
// and, when a flush ahead of the commit moved it further, the table's.
type committable struct {
	Epoch     uint64 `json:"epoch"`
	Watermark int64  `json:"watermark"`
	Table     int64  `json:"table,omitempty"`
}

// New checks the destination and the fence table (creating it if absent)
// and returns the sink.
func New(ctx context.Context, o Options) (*Sink, error) {
	if o.Table == "" {
		return nil, errors.New("pgsink: no destination table: set Options.Table (?table= in a URL)")
	}
	if o.Job == "" {
		return nil, errors.New("pgsink: no job name: set Options.Job (the fence rows are the job's)")
	}
	if o.FenceTable == "" {
		o.FenceTable = DefaultFenceTable
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 4
	}
	if o.FlushBytes <= 0 {
		o.FlushBytes = DefaultFlushBytes
	}
	if o.MaxRowBytes <= 0 {
		o.MaxRowBytes = DefaultMaxRowBytes
	}
	if o.Lease <= 0 {
		o.Lease = spate.DefaultLeaseDuration
	}
	cfg, err := pgx.ParseConfig(o.URL)
	if err != nil {
		return nil, fmt.Errorf("pgsink: the connection URL does not parse (pgx redacts its password): %w", err)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "spate"
	}
	s := &Sink{o: o, cfg: cfg, slots: make(chan struct{}, o.MaxConns), stages: map[pipeline.PartitionID]*stage{}, retired: map[pipeline.PartitionID]bool{}}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgsink: connect to %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	if err := s.describe(ctx, c); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sink) describe(ctx context.Context, c *pgx.Conn) error {
	var oid uint32
	var canInsert, canSelect bool
	err := c.QueryRow(ctx, `SELECT c.oid, format('%I.%I', n.nspname, c.relname), has_table_privilege(c.oid, 'INSERT'), has_table_privilege(c.oid, 'SELECT')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, s.o.Table).Scan(&oid, &s.dest, &canInsert, &canSelect)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgsink: destination table %q does not exist: create it (CREATE TABLE %s (LIKE source_table)), or schema-qualify its name", s.o.Table, s.o.Table)
	}
	if err != nil {
		return fmt.Errorf("pgsink: look up destination table %q: %w", s.o.Table, err)
	}
	if !canInsert {
		return fmt.Errorf("pgsink: no INSERT permission on destination table %s: GRANT INSERT ON %s TO the job's user", s.dest, s.dest)
	}
	rows, err := c.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return fmt.Errorf("pgsink: columns of %s: %w", s.dest, err)
	}
	have, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgsource.Column, error) {
		var k pgsource.Column
		return k, r.Scan(&k.Name, &k.Type)
	})
	if err != nil {
		return fmt.Errorf("pgsink: columns of %s: %w", s.dest, err)
	}
	typeOf := map[string]string{}
	var names []string
	for _, k := range have {
		typeOf[k.Name] = k.Type
		names = append(names, k.Name)
	}
	s.cols = s.o.Columns
	if len(s.cols) == 0 {
		for _, k := range s.o.Shape {
			s.cols = append(s.cols, k.Name)
		}
	}
	if len(s.cols) == 0 {
		s.cols = names
	}
	for _, n := range s.cols {
		if _, ok := typeOf[n]; !ok {
			return fmt.Errorf("pgsink: destination table %s has no column %q, which the rows carry: add it (ALTER TABLE %s ADD COLUMN ...) or write to a table of the source's shape (its columns are %s)", s.dest, n, s.dest, strings.Join(names, ", "))
		}
	}
	for _, k := range s.o.Shape {
		if got, ok := typeOf[k.Name]; ok && got != k.Type {
			return fmt.Errorf("pgsink: destination table %s has column %q of type %s, the source's is %s: give the destination the source's shape (CREATE TABLE ... (LIKE source_table))", s.dest, k.Name, got, k.Type)
		}
	}
	quoted := make([]string, len(s.cols))
	for i, n := range s.cols {
		quoted[i] = pgx.Identifier{n}.Sanitize()
	}
	s.copy = "COPY " + s.dest + " (" + strings.Join(quoted, ", ") + ") FROM STDIN"

	s.fence = pgx.Identifier{s.o.FenceTable}.Sanitize()
	create := `CREATE TABLE IF NOT EXISTS ` + s.fence + ` (
		job text NOT NULL, split text NOT NULL, dest text NOT NULL,
		epoch bigint NOT NULL, watermark bigint NOT NULL, last_key text,
		PRIMARY KEY (job, split))`
	_, err = c.Exec(ctx, create)
	for try := 0; try < 3; try++ {
		// Another worker created it at the same moment: IF NOT EXISTS does
		// not guard against that (a unique violation in the catalog, or
		// its row type or table found already there). It exists now.
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "23505" && pe.Code != "42P07" && pe.Code != "42710") {
			break
		}
		_, err = c.Exec(ctx, create)
	}
	if err != nil {
		return fmt.Errorf("pgsink: create the fence table %s: %w (the job's user needs CREATE on the schema, or create it beforehand)", s.o.FenceTable, err)
	}
	var other string
	err = c.QueryRow(ctx, `SELECT job FROM `+s.fence+` WHERE dest = $1 AND job <> $2 LIMIT 1`, s.dest, s.o.Job).Scan(&other)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("pgsink: read the fence table %s: %w", s.o.FenceTable, err)
	default:
		return fmt.Errorf("pgsink: destination table %s already holds the output of job %q (its rows in %s): write job %q to another table, or, if %s was emptied, DELETE FROM %s WHERE job = '%s'",
			s.dest, other, s.o.FenceTable, s.o.Job, s.dest, s.o.FenceTable, strings.ReplaceAll(other, "'", "''"))
	}
	return s.checkNotEmptied(ctx, c, canSelect)
}

// checkNotEmptied refuses a destination emptied (TRUNCATE, DELETE) since
// the job wrote into it: the fence rows still say which rows it holds, so
// the job would skip them, and they would be missing. A fence row's
// watermark moves only in the transaction that copies its rows, so a
// watermark above 0 and an empty table mean the rows were deleted. (A
// table emptied only in part is not seen: spate verify finds it.)
func (s *Sink) checkNotEmptied(ctx context.Context, c *pgx.Conn, canSelect bool) error {
	var splits, written int64
	if err := c.QueryRow(ctx, `SELECT count(*), coalesce(sum(watermark), 0)::bigint FROM `+s.fence+`
		WHERE job = $1 AND dest = $2 AND watermark > 0`, s.o.Job, s.dest).Scan(&splits, &written); err != nil {
		return fmt.Errorf("pgsink: read the fence table %s: %w", s.o.FenceTable, err)
	}
	if written == 0 || !canSelect {
		return nil
	}
	var some bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.dest+`)`).Scan(&some); err != nil {
		return fmt.Errorf("pgsink: look into destination table %s: %w", s.dest, err)
	}
	if some {
		return nil
	}
	job := strings.ReplaceAll(s.o.Job, "'", "''")
	return fmt.Errorf("pgsink: destination table %s is empty, but %s says job %q wrote %d rows into it (in %d splits, by a run that did not complete) and it was emptied since: going on would skip those rows, and they would be missing. To copy from the start: DELETE FROM %s WHERE job = '%s', and delete the job's progress from its coordination store (spate delete --job %s); or put the rows back",
		s.dest, s.o.FenceTable, s.o.Job, written, splits, s.o.FenceTable, job, s.o.Job)
}

// Destination implements [pipeline.SinkDestination].
func (s *Sink) Destination() string { return s.dest }

// conn takes a connection; put gives it back (nil err) or closes it.
func (s *Sink) conn(ctx context.Context) (*pgx.Conn, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.poolMu.Lock()
	if n := len(s.idle); n > 0 {
		c := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.poolMu.Unlock()
		return c, nil
	}
	s.poolMu.Unlock()
	c, err := pgx.ConnectConfig(ctx, s.cfg)
	if err != nil {
		<-s.slots
		return nil, fmt.Errorf("connect to %s:%d: %w", s.cfg.Host, s.cfg.Port, err)
	}
	return c, nil
}

func (s *Sink) put(c *pgx.Conn, err error) {
	if err != nil || c.IsClosed() {
		_ = c.Close(context.Background())
	} else {
		s.poolMu.Lock()
		s.idle = append(s.idle, c)
		s.poolMu.Unlock()
	}
	<-s.slots
}

// OpenStage implements [pipeline.StagingSink]: the tenancy takes the
// split's fence at its epoch and learns the table's watermark.
func (s *Sink) OpenStage(ctx context.Context, t pipeline.StageTenancy, committed []byte) error {
	var prev committable
	if committed != nil {
		if err := json.Unmarshal(committed, &prev); err != nil {
			return fmt.Errorf("pgsink: split %s: the committed output %q is not this sink's: %v", t.Split, committed, err)
		}
	}
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	var w int64
	var key *string
	var dest string
	err = c.QueryRow(ctx, `INSERT INTO `+s.fence+` AS f (job, split, dest, epoch, watermark) VALUES ($1, $2, $3, $4, 0)
		ON CONFLICT (job, split) DO UPDATE SET epoch = EXCLUDED.epoch WHERE f.epoch <= EXCLUDED.epoch
		RETURNING f.watermark, f.last_key, f.dest`, s.o.Job, t.Split.String(), s.dest, int64(t.Epoch)).Scan(&w, &key, &dest)
	s.put(c, ignoreNoRows(err))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgsink: split %s: the fence in %s holds an epoch later than this tenancy's %d: a newer owner took the split: %w", t.Split, s.o.FenceTable, t.Epoch, spate.ErrFenced)
	case err != nil:
		return fmt.Errorf("pgsink: split %s: take the fence in %s: %w", t.Split, s.o.FenceTable, err)
	case dest != s.dest:
		return fmt.Errorf("pgsink: split %s of job %q was written to table %s, not %s (%s): point the job at %s, or start a new job", t.Split, s.o.Job, dest, s.dest, s.o.FenceTable, dest)
	case w < max(prev.Watermark, prev.Table):
		return fmt.Errorf("pgsink: split %s: %s says table %s holds its rows up to %d, but the job committed up to %d: the fence row was deleted or the table restored; to start over, empty %s, delete job %q's rows from %s and the job's progress from its coordination store (spate delete --job %[7]s)",
			t.Split, s.o.FenceTable, s.dest, w, max(prev.Watermark, prev.Table), s.dest, s.o.Job, s.o.FenceTable)
	}
	st := &stage{t: t, skipBelow: w, flushed: w, next: w}
	st.ctx, st.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if w > prev.Watermark {
		st.checkKey = key
	}
	s.mu.Lock()
	s.stages[t.Partition] = st
	delete(s.retired, t.Partition)
	s.mu.Unlock()
	return nil
}

func ignoreNoRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

func (s *Sink) stage(p pipeline.PartitionID) (*stage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stages[p], s.retired[p]
}

// Write implements [pipeline.Sink]: rows are staged in memory until the
// commit's flush, or until a split's staged rows reach FlushBytes, which
// flushes them at once. Records of a tenancy that ended are dropped (the
// next owner reads them again).
func (s *Sink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	for len(records) > 0 {
		n := 1
		for n < len(records) && records[n].Partition == records[0].Partition {
			n++
		}
		if err := s.writeRun(ctx, records[:n]); err != nil {
			return err
		}
		records = records[n:]
	}
	return nil
}

// WriteChunks implements [pipeline.ChunkedSink]: the chunks are staged in
// turn, as Write would stage them as one slice, without copying them into
// one first. A retried write stages nothing twice: rows below a split's
// last staged offset are dropped.
func (s *Sink) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	for _, c := range chunks {
		if err := s.Write(ctx, shard, c); err != nil {
			return err
		}
	}
	return nil
}

// writeRun stages records of one partition, flushing whenever the staged
// rows reach FlushBytes.
func (s *Sink) writeRun(ctx context.Context, records []pipeline.Record) error {
	st, retired := s.stage(records[0].Partition)
	if st == nil {
		if retired {
			return nil
		}
		return fmt.Errorf("pgsink: partition %d: %w (%w)", records[0].Partition, pipeline.ErrNoStage, spate.ErrFatal)
	}
	// A row over the cap fails the batch before any of it is staged.
	for i := range records {
		if r := &records[i]; len(r.Value) > s.o.MaxRowBytes {
			key, size, over := overCap(r, s.o.MaxRowBytes)
			if !over {
				continue // a packed record, each of its rows under the cap
			}
			if len(key) > 64 {
				key = append(key[:64:64], "..."...)
			}
			return spate.Fatalf("pgsink: split %s: table %s: the row with key %q is %d bytes, over the cap of %d (MaxRowBytes); nothing of its batch was written: raise Options.MaxRowBytes (?max_row_bytes= in a URL; the source's cap too), or leave the wide columns out of the copy (the source's Columns)",
				st.t.Split, s.dest, key, size, s.o.MaxRowBytes)
		}
	}
	for len(records) > 0 {
		st.mu.Lock()
		if st.fenced {
			st.mu.Unlock()
			return nil // a zombie's rows: its next Prepare reports the fence
		}
		if err := st.aheadErr; err != nil {
			st.aheadErr = nil
			st.mu.Unlock()
			return err // a retry stages nothing twice (st.next); the rows wait for the next flush
		}
		n := 0
		for n < len(records) && len(st.buf) < s.o.FlushBytes {
			if err := s.stageRow(st, &records[n]); err != nil {
				st.mu.Unlock()
				return err
			}
			n++
		}
		full := len(st.buf) >= s.o.FlushBytes
		ahead := len(st.buf)-st.inflight >= s.aheadBytes()
		st.mu.Unlock()
		records = records[n:]
		switch {
		case full:
			// Wait for the flush running, if any: a destination slower
			// than the source slows the source down, memory stays
			// bounded.
			st.flushing.Lock()
			st.mu.Lock()
			err := st.aheadErr
			st.aheadErr = nil
			st.mu.Unlock()
			if err != nil {
				st.flushing.Unlock()
				return err // a retry stages nothing twice (st.next)
			}
			s.flushAhead(st)
		case ahead && st.flushing.TryLock():
			s.flushAhead(st)
		}
	}
	return nil
}

// aheadBytes is how many staged bytes start a flush ahead of the commit:
// a quarter of FlushBytes, so that a flush runs while the next rows are
// read and staged.
func (s *Sink) aheadBytes() int { return max(s.o.FlushBytes/4, 1) }

// flushAhead flushes all the rows staged, in a goroutine of its own that
// unlocks st.flushing when done (the caller locked it); its failure is
// reported by the tenancy's next Write. The rows stay staged until a flush
// of them succeeds, so Prepare and later flushes try them again.
func (s *Sink) flushAhead(st *stage) {
	s.ahead.Add(1)
	go func() {
		defer s.ahead.Done()
		defer st.flushing.Unlock()
		for {
			err := s.flushBelow(st.ctx, st, math.MaxInt64)
			st.mu.Lock()
			if err != nil && !errors.Is(err, spate.ErrFenced) { // a zombie's next Prepare reports the fence
				st.aheadErr = err
			}
			// Rows staged while it ran are flushed next, at once.
			again := err == nil && len(st.buf) >= s.aheadBytes()
			st.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// overCap finds the first row of r over max bytes: its key and size. The
// keys of a packed record are only walked to name a row found over.
func overCap(r *pipeline.Record, max int) ([]byte, int, bool) {
	if bytes.IndexByte(r.Value, '\n') < 0 {
		return r.Key, len(r.Value), len(r.Value) > max
	}
	if !anyRowOver(r.Value, max) {
		return nil, 0, false
	}
	value := r.Value
	for row := 0; len(value) > 0; row++ {
		n := bytes.IndexByte(value, '\n')
		if n < 0 {
			n = len(value)
		}
		if n > max {
			key, _, _ := bytes.Cut(dropLines(r.Key, int64(row)), []byte{'\n'})
			return key, n, true
		}
		value = value[min(n+1, len(value)):]
	}
	return nil, 0, false
}

// anyRowOver reports whether a line of b ('\n'-separated) is over max
// bytes. It steps a window of max+1 bytes at a time, not a line: every
// line before the window's last '\n' is within max, and a window with
// none holds the start of a line over it.
func anyRowOver(b []byte, max int) bool {
	for len(b) > max {
		j := bytes.LastIndexByte(b[:max+1], '\n')
		if j < 0 {
			return true
		}
		b = b[j+1:]
	}
	return false
}

// dropLines is b after its first n lines ('\n'-separated).
func dropLines(b []byte, n int64) []byte {
	for ; n > 0; n-- {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil
		}
		b = b[i+1:]
	}
	return b
}

// stageRow stages r (one row, or the rows of a packed record); st.mu is
// held.
func (s *Sink) stageRow(st *stage, r *pipeline.Record) error {
	value, key := r.Value, r.Key
	first := r.Offset
	if bytes.IndexByte(value, '\n') >= 0 {
		first = r.Offset - int64(bytes.Count(value, []byte{'\n'}))
		if got := int64(bytes.Count(key, []byte{'\n'})); got != r.Offset-first {
			return spate.Fatalf("pgsink: split %s: a record of %d rows carries %d keys: pack a row's key with each row (pgsource.Options.PackRows)", st.t.Split, r.Offset-first+1, got+1)
		}
	}
	// Rows in the table already, or staged by an earlier attempt of
	// this write, are dropped.
	if from := max(st.skipBelow, st.next); first < from {
		if st.checkKey != nil && first < st.skipBelow && r.Offset >= st.skipBelow-1 {
			// The key of row skipBelow-1 must be the one the fence recorded.
			k, _, _ := bytes.Cut(dropLines(key, st.skipBelow-1-first), []byte{'\n'})
			if *st.checkKey != string(k) {
				return spate.Fatalf("pgsink: split %s: table %s holds the split's rows up to the one with key %q, but the source now reads key %q there: the source's chunk changed under the job, so resuming could lose or repeat rows; copy again into an emptied table (and delete job %q's rows from %s)",
					st.t.Split, s.dest, *st.checkKey, k, s.o.Job, s.o.FenceTable)
			}
		}
		if r.Offset < from {
			return nil
		}
		value, key = dropLines(value, from-first), dropLines(key, from-first)
		first = from
	}
	if !st.checked {
		line, _, _ := bytes.Cut(value, []byte{'\n'})
		if got := bytes.Count(line, []byte{'\t'}) + 1; got != len(s.cols) {
			return spate.Fatalf("pgsink: split %s: rows of %d columns, and table %s takes %d (%s): give the destination the source's shape, or set Columns",
				st.t.Split, got, s.dest, len(s.cols), strings.Join(s.cols, ", "))
		}
		st.checked = true
	}
	if need := len(st.buf) + len(value) + 1; need > cap(st.buf) && first < r.Offset {
		// Packed rows fill the buffer to FlushBytes a megabyte at a time:
		// room for all of it at once, not regrown (and copied) from small.
		grown := make([]byte, len(st.buf), max(need, s.o.FlushBytes+len(value)+1))
		st.buf = grown[:copy(grown, st.buf)]
	}
	st.buf = append(append(st.buf, value...), '\n')
	if i := bytes.LastIndexByte(key, '\n'); i >= 0 {
		key = key[i+1:]
	}
	k := len(st.keys)
	st.keys = append(st.keys, key...)
	st.rows = append(st.rows, stagedRow{first: first, offset: r.Offset, end: len(st.buf), kstart: k, kend: len(st.keys)})
	st.next = r.Offset + 1
	return nil
}

// Prepare implements [pipeline.StagingSink]: one transaction writes the
// staged rows below watermark and advances the fence; a fence held by a
// later epoch rolls it back ([spate.ErrFenced]).
func (s *Sink) Prepare(ctx context.Context, p pipeline.PartitionID, watermark int64, final bool) ([]byte, int64, bool, error) {
	st, _ := s.stage(p)
	if st == nil {
		return nil, 0, false, pipeline.ErrNoStage
	}
	st.flushing.Lock()
	defer st.flushing.Unlock()
	if err := s.flushBelow(ctx, st, watermark); err != nil {
		return nil, 0, false, err
	}
	st.mu.Lock()
	if st.flushed >= watermark {
		st.aheadErr = nil // its rows are in: what failed before has been tried again
	}
	c := committable{Epoch: uint64(st.t.Epoch), Watermark: watermark}
	if st.flushed > watermark {
		c.Table = st.flushed
	}
	st.mu.Unlock()
	out, _ := json.Marshal(c)
	return out, watermark, false, nil
}

// flushBelow writes the staged rows below watermark in one fenced
// transaction (with the fence at watermark, or, for all of them, just
// after the last) and drops them from memory; st.flushing is held.
func (s *Sink) flushBelow(ctx context.Context, st *stage, watermark int64) error {
	st.mu.Lock()
	if st.fenced {
		st.mu.Unlock()
		return fmt.Errorf("pgsink: split %s: the fence in %s holds an epoch later than this tenancy's %d (a newer owner took the split); nothing written: %w", st.t.Split, s.o.FenceTable, st.t.Epoch, spate.ErrFenced)
	}
	n := 0
	for n < len(st.rows) && st.rows[n].offset < watermark {
		n++
	}
	if n < len(st.rows) && st.rows[n].first < watermark {
		st.mu.Unlock()
		return spate.Fatalf("pgsink: split %s: watermark %d falls inside a packed record (rows %d to %d): a commit must end at a record's end", st.t.Split, watermark, st.rows[n].first, st.rows[n].offset)
	}
	if n == 0 {
		st.mu.Unlock()
		return nil
	}
	last := st.rows[n-1]
	if n == len(st.rows) && watermark == math.MaxInt64 {
		watermark = last.offset + 1
	}
	// Write appends past last.end only: the flushed bytes stay put.
	data := st.buf[:last.end:last.end]
	// The slice is taken under st.mu: a Write running beside the flush
	// appends to st.rows (past n, so these rows stay put).
	rows := st.rows[:n:n]
	st.inflight = last.end
	lastKey := string(st.keys[last.kstart:last.kend])
	epoch, split := st.t.Epoch, st.t.Split
	st.mu.Unlock()

	err := s.flush(ctx, split, epoch, watermark, lastKey, data, rows)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inflight = 0
	if errors.Is(err, spate.ErrFenced) {
		st.fenced = true
		st.buf, st.keys, st.rows = nil, nil, nil
	}
	if err != nil {
		return err
	}
	rest := st.rows[n:]
	for i := range rest {
		rest[i].end -= last.end
		rest[i].kstart -= last.kend
		rest[i].kend -= last.kend
	}
	st.rows = append(st.rows[:0], rest...)
	// The flush is over, so nothing reads the flushed bytes any more: the
	// rest moves to the front and the buffers are reused, not grown again
	// from nothing for every flush.
	st.buf = st.buf[:copy(st.buf, st.buf[last.end:])]
	st.keys = st.keys[:copy(st.keys, st.keys[last.kend:])]
	st.flushed = max(st.flushed, watermark)
	return nil
}

// flushTimeout is a flush's time: half the lease.
func (s *Sink) flushTimeout() time.Duration { return s.o.Lease / 2 }

// flush is one transaction: the fence, then the rows; within
// flushTimeout, or it fails retryably with nothing written.
//
// The rows the fence says the table holds already are not written again:
// a flush whose commit went through while its client saw an error (a
// connection lost, the time out) is tried again as a whole.
func (s *Sink) flush(ctx context.Context, split spate.SplitID, epoch spate.LeaseEpoch, watermark int64, lastKey string, data []byte, rows []stagedRow) (err error) {
	limit := s.flushTimeout()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}

	defer func() { s.put(c, err) }()
	defer func() {
		if err != nil && !errors.Is(err, spate.ErrFenced) && !errors.Is(err, spate.ErrFatal) && (ctx.Err() != nil || isQueryCanceled(err)) {
			err = spate.Retryablef("pgsink: split %s: the flush into %s did not finish within %v (half the lease of %v, so that it ends before the tenancy can) and was rolled back, nothing written; it is tried again (is another session holding a lock on %s or %s? see pg_locks): %v",
				split, s.dest, limit, s.o.Lease, s.dest, s.o.FenceTable, err)
		}
	}()
	tx, err := c.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgsink: split %s: begin: %w", split, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// The server ends the transaction's statements in time even if the
	// client cannot (the client's cancel needs a connection of its own).
	if _, err = tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true)", strconv.FormatInt(max(limit.Milliseconds(), 1), 10)); err != nil {
		return fmt.Errorf("pgsink: split %s: set the flush's statement_timeout: %w", split, err)
	}
	var held, have int64
	err = tx.QueryRow(ctx, `SELECT epoch, watermark FROM `+s.fence+` WHERE job = $1 AND split = $2 FOR UPDATE`, s.o.Job, split.String()).Scan(&held, &have)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgsink: split %s: read the fence in %s: %w", split, s.o.FenceTable, err)
	}
	if errors.Is(err, pgx.ErrNoRows) || held > int64(epoch) {
		return fmt.Errorf("pgsink: split %s: the fence in %s holds an epoch later than this tenancy's %d (a newer owner took the split); nothing written: %w", split, s.o.FenceTable, epoch, spate.ErrFenced)
	}
	if have >= watermark {
		return tx.Rollback(ctx) // in the table already: an earlier try's commit went through
	}
	if have > rows[0].first {
		i := 0
		for i < len(rows) && rows[i].offset < have {
			i++
		}
		switch {
		case i == len(rows):
			data = nil
		case rows[i].first != have:
			return spate.Fatalf("pgsink: split %s: %s says table %s holds the split's rows up to %d, inside a record staged (rows %d to %d): delete job %q's rows from %s and copy again into an emptied table",
				split, s.o.FenceTable, s.dest, have, rows[i].first, rows[i].offset, s.o.Job, s.o.FenceTable)
		case i > 0:
			data = data[rows[i-1].end:]
		}
	}
	if _, err = tx.Exec(ctx, `UPDATE `+s.fence+` SET epoch = $1, watermark = $2, last_key = $3
		WHERE job = $4 AND split = $5`, int64(epoch), watermark, lastKey, s.o.Job, split.String()); err != nil {
		return fmt.Errorf("pgsink: split %s: advance the fence in %s: %w", split, s.o.FenceTable, err)
	}
	if len(data) == 0 {
		// Nothing left to write.
	} else if _, err = c.PgConn().CopyFrom(ctx, bytes.NewReader(data), s.copy); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && !isQueryCanceled(err) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "42")) {
			return spate.Fatalf("pgsink: split %s: table %s refuses the rows: %v: give the destination the source's shape (CREATE TABLE ... (LIKE source_table)) and drop constraints the source's rows break", split, s.dest, err)
		}
		return fmt.Errorf("pgsink: split %s: copy into %s: %w", split, s.dest, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgsink: split %s: commit into %s: %w", split, s.dest, err)
	}
	return nil
}

// isQueryCanceled reports whether err is the server's cancel of a
// statement (statement_timeout, or the client's cancel request).
func isQueryCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// Publish implements [pipeline.StagingSink]: nothing to do, the flush
// made the rows visible.
func (s *Sink) Publish(context.Context, pipeline.PartitionID, []byte) error { return nil }

// CloseStage implements [pipeline.StagingSink]. Rows staged and not
// flushed are dropped: the next owner reads them again.
func (s *Sink) CloseStage(p pipeline.PartitionID, completed bool) {
	s.mu.Lock()
	if st := s.stages[p]; st != nil {
		st.cancel() // a flush ahead still running ends, rolled back, unless it committed
	}
	delete(s.stages, p)
	s.retired[p] = true
	s.mu.Unlock()
}

// CleanJob implements [pipeline.StageCleaner]: once the job completed, its
// fence rows go. A zombie that wakes later finds no row to advance and
// writes nothing.
func (s *Sink) CleanJob(ctx context.Context) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, `DELETE FROM `+s.fence+` WHERE job = $1 AND dest = $2`, s.o.Job, s.dest)
	s.put(c, err)
	if err != nil {
		return fmt.Errorf("pgsink: delete job %q's rows from %s: %w", s.o.Job, s.o.FenceTable, err)
	}
	return nil
}

// Close ends the flushes ahead of the commit still running and closes the
// sink's connections.
func (s *Sink) Close() error {
	s.mu.Lock()
	for _, st := range s.stages {
		st.cancel()
	}
	s.mu.Unlock()
	s.ahead.Wait()
	s.poolMu.Lock()
	idle := s.idle
	s.idle = nil
	s.poolMu.Unlock()
	for _, c := range idle {
		_ = c.Close(context.Background())
	}
	return nil
}
