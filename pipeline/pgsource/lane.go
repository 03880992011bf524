package pgsource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Batch sizes of a chunk's reader: what it hands the lane at once.
const (
	readBatchRows  = 4096
	readBatchBytes = 1 << 20
	// readAttempts bounds the consecutive failed reads of a chunk (a lost
	// connection) before it is set aside.
	readAttempts = 5
)

// lane reads one chunk. Poll runs on one runner goroutine; the fields under
// mu are shared with the controller (EncodeCommit, Sweep).
type lane struct {
	src    *Source
	split  spate.SplitID
	id     pipeline.LaneID
	part   pipeline.PartitionID
	issuer *pipeline.AckIssuer
	poison func(string)
	waker  spate.Waker
	chunk  chunk
	ctx    context.Context
	cancel context.CancelFunc

	// The runner's alone.
	items    chan item
	buf      []row
	bufArena arena   // the memory buf's rows are in
	lent     []arena // memory of rows emitted: the runtime is done with it at the next Poll
	payloads []pipeline.RawPayload
	fails    int
	set      bool // set aside (poisoned)
	// readCancel stops the current read (a division moved the chunk's
	// end: divide.go).
	readCancel context.CancelFunc

	mu             sync.Mutex
	next           int64   // ordinal of the next row to emit
	lastKey        *string // key of the last row emitted (nil: none yet)
	resumedAt      int64
	marks          []mark // each emitted batch's last ordinal and key
	done           bool   // the chunk was read to its end and all emitted
	committed      int64  // the last encoded watermark
	committedState []byte
	// Runtime division (divide.go): weight is the split's rows as planned
	// (or as its last division kept); dividing holds the lane's emission
	// while a division is decided; restart has the runner drop what it
	// read ahead and read again up to the chunk's new end.
	weight   uint64
	dividing bool
	restart  bool
}

type mark struct {
	last int64
	key  string
}

// row is one row as read, or with PackRows n > 1 rows packed: their
// lines joined by '\n' and their keys likewise. Slices of one batch's
// arena.
type row struct {
	key, value []byte
	n          int
}

// rowsIn is how many rows r holds.
func (r row) rowsIn() int64 { return int64(max(r.n, 1)) }

// lastKey is the key of r's last row.
func (r row) lastKey() []byte {
	if r.n > 1 {
		return r.key[bytes.LastIndexByte(r.key, '\n')+1:]
	}
	return r.key
}

// arena is the memory a batch's rows are in: their lines, and with
// PackRows their keys.
type arena struct{ lines, keys []byte }

// item is what the chunk's reader hands the lane: rows, then the end or an
// error.
type item struct {
	rows   []row
	arena  arena
	eof    bool
	err    error
	poison string
}

func (l *lane) ID() pipeline.LaneID             { return l.id }
func (l *lane) Partition() pipeline.PartitionID { return l.part }

// start reads the chunk from after lastKey in a goroutine of its own.
func (l *lane) start() {
	ch := make(chan item, 2)
	l.items = ch

	l.mu.Lock()
	from := l.chunk.Lo
	if l.lastKey != nil {
		from = l.lastKey
	}
	sql := l.copySQL(from)
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(l.ctx)
	l.readCancel = cancel
	go l.read(ctx, ch, sql)
}

// copySQL is the chunk's read from after from.
func (l *lane) copySQL(from *string) string {
	t, k := l.src.table, ident(l.src.table.Key)
	var conds []string
	if from != nil {
		conds = append(conds, k+" > "+t.keyLit(*from))
	}
	if l.chunk.Hi != nil {
		conds = append(conds, k+" <= "+t.keyLit(*l.chunk.Hi))
	}
	return "COPY (SELECT " + t.selectList() + " FROM " + t.Name + bounded(conds, l.src.opts.Where) +
		" ORDER BY " + k + ") TO STDOUT"
}

var errPoison = errors.New("row over the cap")

func (l *lane) read(ctx context.Context, ch chan<- item, sql string) {
	send := func(it item) bool {
		select {
		case ch <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	c, err := l.src.conn(ctx)
	if err != nil {
		send(item{err: fmt.Errorf("connect: %w", err)})
		return
	}
	reuse := false
	defer func() { l.src.put(c, reuse) }()
	w := &rowWriter{l: l, send: send, free: l.src.free}
	if l.src.opts.PackRows {
		w.next(readBatchBytes + readBatchBytes/4) // a packed batch fills it: no regrowing
	} else {
		w.next(64 << 10)
	}
	_, err = c.PgConn().CopyTo(ctx, w, sql)
	if !w.flush() { // the rows read before an error or a poison are good
		return
	}
	if w.poison != "" {
		send(item{poison: w.poison})
		return
	}
	if err == nil && len(w.partial) > 0 {
		err = errors.New("the stream ended inside a row")
	}
	if err != nil {
		if ctx.Err() == nil {
			l.src.dropIdle()
		}
		send(item{err: err})
		return
	}
	// The chunk was read to its end: the connection is idle, in no
	// transaction, and reads the next chunk.
	reuse = ctx.Err() == nil
	send(item{eof: true})
}

// rowWriter cuts COPY's text stream into rows and hands them over in
// batches.
type rowWriter struct {
	l       *lane
	send    func(item) bool
	free    <-chan arena
	arena   []byte
	spans   [][3]int // key start, tab, end of each row in arena
	partial []byte
	poison  string
	// With PackRows: the rows' lines go to arena and their keys to keys,
	// each joined by '\n'; packed counts them.
	keys   []byte
	packed int
}

func (w *rowWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(w.partial) > 0 {
		p = append(w.partial, p...)
		w.partial = nil
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append([]byte(nil), p...)
			if len(w.partial) > w.l.src.opts.MaxRowBytes+MaxKeyBytes {
				return 0, w.overCap(w.partial, len(w.partial))
			}
			break
		}
		if err := w.add(p[:i]); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

func (w *rowWriter) overCap(line []byte, size int) error {
	key, _, _ := bytes.Cut(line, []byte{'\t'})
	if len(key) > 64 {
		key = append(key[:64:64], "..."...)
	}
	t := w.l.src.table
	w.poison = fmt.Sprintf("table %s: the row with key %s = %q is over %d bytes (MaxRowBytes %d): raise Options.MaxRowBytes (?max_row_bytes= in a URL) or leave the wide columns out (Columns)",
		t.Name, t.Key, key, size, w.l.src.opts.MaxRowBytes)
	return errPoison
}

func (w *rowWriter) add(line []byte) error {
	tab := bytes.IndexByte(line, '\t')
	if tab < 0 {
		return fmt.Errorf("a row without columns: %q", line)
	}
	if len(line)-tab-1 > w.l.src.opts.MaxRowBytes {
		return w.overCap(line, len(line)-tab-1)
	}
	if tab > MaxKeyBytes {
		t := w.l.src.table
		w.poison = fmt.Sprintf("table %s: a key %s of %d bytes is over the cap of %d (the last key read rides in every commit): range over a shorter key (Key)",
			t.Name, t.Key, tab, MaxKeyBytes)
		return errPoison
	}
	if w.l.src.opts.PackRows {
		if w.packed > 0 {
			w.arena = append(w.arena, '\n')
			w.keys = append(w.keys, '\n')
		}
		w.arena = append(w.arena, line[tab+1:]...)
		w.keys = append(w.keys, line[:tab]...)
		if w.packed++; len(w.arena) >= readBatchBytes {
			if !w.flush() {
				return context.Canceled
			}
		}
		return nil
	}
	start := len(w.arena)
	w.arena = append(w.arena, line...)
	w.spans = append(w.spans, [3]int{start, start + tab, len(w.arena)})
	if len(w.spans) >= readBatchRows || len(w.arena) >= readBatchBytes {
		if !w.flush() {
			return context.Canceled
		}
	}
	return nil
}

// next is memory for the next batch: some the lane is done with, or new
// with room for size bytes of lines.
func (w *rowWriter) next(size int) {
	select {
	case a := <-w.free:
		w.arena, w.keys = a.lines[:0], a.keys[:0]
	default:
		w.arena = make([]byte, 0, size)
		w.keys = nil
		if w.l.src.opts.PackRows {
			w.keys = make([]byte, 0, size/4)
		}
	}
}

// flush hands the rows read so far over; false when the lane closed.
func (w *rowWriter) flush() bool {
	if w.packed > 0 {
		r := row{key: w.keys, value: w.arena, n: w.packed}
		a := arena{lines: w.arena, keys: w.keys}
		w.next(readBatchBytes + readBatchBytes/4)
		w.packed = 0
		return w.send(item{rows: []row{r}, arena: a})
	}
	if len(w.spans) == 0 {
		return true
	}
	rows := make([]row, len(w.spans))
	for i, s := range w.spans {
		rows[i] = row{key: w.arena[s[0]:s[1]:s[1]], value: w.arena[s[1]+1 : s[2] : s[2]]}
	}
	a := arena{lines: w.arena}
	w.next(min(2*len(w.arena), readBatchBytes+readBatchBytes/4))
	w.spans = w.spans[:0]
	return w.send(item{rows: rows, arena: a})
}

// Poll implements [pipeline.Lane].
func (l *lane) Poll(maxRecords int, timeout time.Duration) (*pipeline.Batch, error) {
	// The runtime is done with the rows emitted before: their memory goes
	// back to the reader.
	for _, a := range l.lent {
		select {
		case l.src.free <- a:
		default:
		}
	}
	clear(l.lent)
	l.lent = l.lent[:0]
	l.mu.Lock()
	restart := l.restart
	l.restart = false
	l.mu.Unlock()
	if restart {
		// A division moved the chunk's end: what was read ahead may be
		// the residual's.
		l.buf, l.bufArena = nil, arena{}
		if l.readCancel != nil {
			l.readCancel()
		}
		l.items = nil
	}
	if len(l.buf) == 0 {
		if l.set || l.isDone() {
			time.Sleep(timeout) // end of input: idle, never spin
			return nil, nil
		}
		if l.items == nil {
			l.start()
		}
		var it item
		select {
		case it = <-l.items:
		case <-time.After(timeout):
			return nil, nil
		}
		switch {
		case it.poison != "":
			l.set = true
			l.poison(it.poison)
			return nil, nil
		case it.err != nil:
			l.items = nil // read again from the last key emitted
			if l.fails++; l.fails >= readAttempts {
				l.set = true
				l.poison(fmt.Sprintf("table %s: reading the chunk failed %d times in a row, last: %v; check the server and the job's permissions", l.src.table.Name, l.fails, it.err))
				return nil, nil
			}
			return nil, spate.Retryablef("pgsource: table %s, split %s: read: %v (read again from the last key emitted)", l.src.table.Name, l.split, it.err)
		case it.eof:
			l.mu.Lock()
			if l.dividing || l.restart {
				// The end of a read a division may change: read again.
				l.mu.Unlock()
				l.items = nil
				return nil, nil
			}
			l.done = true
			l.mu.Unlock()
			l.src.finished(l.split)
			l.waker.Wake()
			return nil, nil
		}
		l.fails = 0
		l.buf, l.bufArena = it.rows, it.arena
	}
	n := min(len(l.buf), max(maxRecords, 1))
	// One critical section decides and records the emission, so that a
	// division (divide.go) sees either all of this batch or none of it.
	l.mu.Lock()
	if l.dividing || l.restart {
		l.mu.Unlock()
		time.Sleep(min(timeout, time.Millisecond))
		return nil, nil
	}
	end := l.next // after the last row emitted
	l.payloads = l.payloads[:0]
	for _, r := range l.buf[:n] {
		end += r.rowsIn()
		l.payloads = append(l.payloads, pipeline.RawPayload{Key: r.key, Value: r.value, Partition: l.part, Offset: end - 1})
	}
	key := unescape(l.buf[n-1].lastKey())
	if l.buf = l.buf[n:]; len(l.buf) == 0 {
		l.lent = append(l.lent, l.bufArena)
		l.bufArena = arena{}
	}
	last := end - 1
	l.next = last + 1
	l.lastKey = &key
	l.marks = append(l.marks, mark{last: last, key: key})
	l.mu.Unlock()
	return &pipeline.Batch{Payloads: l.payloads, Ack: l.issuer.Issue(l.part, last)}, nil
}

func (l *lane) isDone() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// encode is the progress at watermark: the key of row watermark-1.
func (l *lane) encode(watermark int64) (spate.SplitProgress, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.committedState
	if watermark != l.committed {
		i := 0
		for i < len(l.marks) && l.marks[i].last < watermark-1 {
			i++
		}
		if i == len(l.marks) || l.marks[i].last != watermark-1 {
			return spate.SplitProgress{}, spate.Fatalf("pgsource: split %s: watermark %d is no batch end this lane emitted", l.split, watermark)
		}
		st = state(l.marks[i].key)
		l.marks = l.marks[i+1:]
		l.committed, l.committedState = watermark, st
	}
	if l.done && watermark >= l.next {
		return spate.CompletedProgress(watermark, st), nil
	}
	p := spate.NewSplitProgress(watermark, st)
	if l.weight > uint64(watermark) {
		p.Remaining = l.weight - uint64(watermark) // rows, the weight's unit: the division trigger's hint
	}
	return p, nil
}

// unescape decodes one field of COPY's text format.
func unescape(b []byte) string {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' || i+1 == len(b) {
			out = append(out, c)
			continue
		}
		i++
		switch c = b[i]; c {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'v':
			out = append(out, '\v')
		case 'x':
			j := i + 1
			for j < len(b) && j < i+3 && isHex(b[j]) {
				j++
			}
			if j == i+1 {
				out = append(out, 'x')
				continue
			}
			v, _ := strconv.ParseUint(string(b[i+1:j]), 16, 8)
			out = append(out, byte(v))
			i = j - 1
		default:
			if c >= '0' && c <= '7' {
				j := i
				for j < len(b) && j < i+3 && b[j] >= '0' && b[j] <= '7' {
					j++
				}
				v, _ := strconv.ParseUint(string(b[i:j]), 8, 8)
				out = append(out, byte(v))
				i = j - 1
				continue
			}
			out = append(out, c)
		}
	}
	return string(out)
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Fields decodes a record's Value (a row in COPY text format) into its
// columns' text, nil for NULL.
func Fields(value []byte) []*string {
	var out []*string
	for f := range bytes.SplitSeq(value, []byte{'\t'}) {
		if string(f) == `\N` {
			out = append(out, nil)
			continue
		}
		s := unescape(f)
		out = append(out, &s)
	}
	return out
}
