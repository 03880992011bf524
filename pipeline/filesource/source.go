package filesource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Source reads the splits of a [Planner]'s plan. It implements
// [pipeline.SplitSource] and [pipeline.StopReader].
type Source struct {
	objs Objects
	log  *slog.Logger
	mu   sync.Mutex
	// splits holds the open tenancies by split id.
	splits    map[spate.SplitID]*splitState
	finishing []spate.SplitID
	final     bool // the plan is final: tail lanes end at their file's end
	maxLine   int  // the line cap, see WithMaxLineBytes
	follow    *followState
}

type splitState struct {
	lane  *lane
	tail  *tailLane // a followed file's lane (lane is nil then)
	total int64
	// acked is the highest watermark EncodeCommit saw (or the resume point).
	acked int64
	// parked is whether the progress last handed to the coordination driver was parked.
	parked bool
}

// NewSource reads the objects of objs (the planner's input).
func NewSource(objs Objects) *Source {
	return &Source{objs: objs, log: slog.Default(), splits: map[spate.SplitID]*splitState{}, maxLine: DefaultMaxLineBytes,
		follow: newFollowState(PlannerOptions{Follow: true})}
}

// WithPlanner has the source's followed files obey p's options: a file
// idle for ReleaseAfter parks (freeing its lane until it grows), and a
// lane that sees its file renamed asks p for a listing at once (which
// runs where this process leads the job). Without it the
// defaults apply ([DefaultFollowExcludes], [DefaultReleaseAfter]).
func (s *Source) WithPlanner(p *Planner) *Source {
	s.follow = p.follow
	return s
}

// DefaultMaxLineBytes is the default line cap: 1 MiB.
const DefaultMaxLineBytes = 1 << 20

// WithMaxLineBytes sets the line cap: the longest line (its newline not
// counted) a lane reads. A lane holds a whole line in memory, so the cap
// bounds its memory, at about twice the cap (n <= 0: the default,
// [DefaultMaxLineBytes]). A longer line fails its split, through the
// coordinator, with an error naming the file and the line's byte offset:
// the lines before it are delivered, the rest of the job goes on, and the
// split is quarantined at the attempt cap; requeue it after raising the
// cap. Not part of the job's identity: a worker with a larger cap can
// take the split over.
func (s *Source) WithMaxLineBytes(n int) *Source {
	if n <= 0 {
		n = DefaultMaxLineBytes
	}
	s.maxLine = n
	return s
}

// WithLogger has the source log to log (what happened to a followed file:
// a rename, a truncation, a deletion). The default is slog.Default().
func (s *Source) WithLogger(log *slog.Logger) *Source {
	s.log = log
	return s
}

// PlanFinalized implements [pipeline.PlanFinalizer]: from now on each
// followed file's split completes at the end of the file.
func (s *Source) PlanFinalized() {
	s.mu.Lock()
	s.final = true
	var tails []*tailLane
	for _, st := range s.splits {
		if st.tail != nil {
			tails = append(tails, st.tail)
		}
	}
	s.mu.Unlock()
	for _, t := range tails {
		t.setFinal()
	}
}

// Lag is the bytes the followed files that this source's lanes hold
// have beyond what was read: a continuous job's backlog here.
func (s *Source) Lag() (bytes int64, files int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.splits {
		if st.tail != nil {
			bytes += st.tail.lag()
			files++
		}
	}
	return bytes, files
}

// New assembles a coordinated backfill of objs over coord. For a directory:
//
//	filesource.New(filesource.Dir("./logs"), coord, filesource.PlannerOptions{})
func New[C spate.SplitCoordinator](objs Objects, coord C, popts PlannerOptions, dopts ...pipeline.DriverOption) *pipeline.CoordinatedSource[C] {
	planner := NewPlanner(objs, popts)
	return pipeline.NewCoordinatedSource(coord, NewSource(objs).WithMaxLineBytes(popts.MaxLineBytes).WithPlanner(planner), planner, dopts...)
}

// ValidateResume rejects progress that is not on a line boundary of the
// split (the files drifted, or the progress belongs elsewhere). Its
// rejections are not Fatal: the coordination driver fails the split
// through the coordinator (an attempt is consumed; the split is
// quarantined at the attempt cap) and the pipeline goes on with the rest
// of the job. Each names the file, and for a file that shrank or is gone,
// its sizes.
func (s *Source) ValidateResume(spec spate.SplitSpec, p spate.SplitProgress) error {
	d, err := DecodeDescriptor(spec.Descriptor)
	if err != nil {
		return err
	}
	if d.Tail != nil {
		// Checked by the lane when it opens the file: where the file is
		// now, and whether it was truncated, decide the resume point.
		_, err := decodeTailState(p.State)
		return err
	}
	total := d.Total()
	if d.Range != nil {
		// A range's last line may end beyond the range, up to its last
		// member's end.
		total = -d.Range.Start
		for _, f := range d.Files {
			total += f.Size
		}
	}
	if p.Watermark < 0 || p.Watermark > total {
		return rejectedf("filesource: resume watermark %d outside the split's %d bytes", p.Watermark, total)
	}
	var base int64
	if d.Range != nil {
		base = -d.Range.Start // split offsets are relative to the range's start
	}
	for _, f := range d.Files {
		if p.Watermark > base && p.Watermark < base+f.Size {
			return s.checkResumeAt(f, p.Watermark-base)
		}
		base += f.Size
	}
	return nil
}

// checkResumeAt checks that the member f, as it is now, still holds what
// the split committed up to off (a file offset inside it), and that off
// starts a line.
func (s *Source) checkResumeAt(f Member, off int64) error {
	r, size, err := s.objs.Open(context.Background(), f.Name, off-1)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rejectedf("filesource: resume check: %s was deleted under the job: the split's commits reach offset %d of its %d planned bytes, and the rest cannot be read",
			quoteName(f.Name), off, f.Size)
	case err != nil:
		return rejectedf("filesource: resume check of %s: %w", quoteName(f.Name), err)
	}
	defer r.Close()
	if size < f.Size {
		return rejectedf("filesource: resume check: %s is %d bytes now, %d when planned, and the split's commits reach offset %d of it: the file was truncated or replaced under the job",
			quoteName(f.Name), size, f.Size, off)
	}
	var b [1]byte
	if _, err = io.ReadFull(r, b[:]); err != nil {
		return rejectedf("filesource: resume check of %s at offset %d (%d bytes planned, %d now): %w", quoteName(f.Name), off-1, f.Size, size, err)
	}
	if b[0] != '\n' {
		return rejectedf("filesource: resume watermark %d is not on a line boundary of %s", off, quoteName(f.Name))
	}
	return nil
}

// rejection is a split-level failure: the split's input is not what was
// planned (or what its progress says), so the split cannot go on, but
// nothing else is wrong. It is not Fatal, so the pipeline keeps running;
// errors.Is matches [spate.ErrRetryable] (the only class that does not
// stop a pipeline) and errDrift.
type rejection struct{ err error }

func rejectedf(format string, args ...any) error { return &rejection{fmt.Errorf(format, args...)} }

func (e *rejection) Error() string { return e.err.Error() }

// Is does not look into the cause: whatever class the cause had, only the
// split is rejected.
func (e *rejection) Is(target error) bool {
	return target == spate.ErrRetryable || target == errDrift
}

// OpenSplit builds the lane of a tenancy; it touches no file (the lane
// opens them on its first poll).
func (s *Source) OpenSplit(o pipeline.SplitOpening) (pipeline.Lane, error) {
	d, err := DecodeDescriptor(o.Spec.Descriptor)
	if err != nil {
		return nil, err
	}
	start := int64(0)
	if o.Progress != nil {
		start = o.Progress.Watermark
	}
	if d.Tail != nil {
		return s.openTail(o, *d.Tail, start)
	}
	l := &lane{
		id: o.Lane, part: o.Partition, split: o.Spec.ID, objs: s.objs, files: d.Files,
		issuer: o.Issuer, poison: o.Poison, pos: start, emitted: start, maxLine: s.maxLine,
		limit: -1,
	}
	if d.Range != nil {
		l.origin, l.limit = d.Range.Start, d.Total()
	}
	l.onExhausted = func() {
		s.mu.Lock()
		s.finishing = append(s.finishing, o.Spec.ID)
		s.mu.Unlock()
		o.Waker.Wake()
	}
	s.mu.Lock()
	s.splits[o.Spec.ID] = &splitState{lane: l, total: d.Total(), acked: start}
	s.mu.Unlock()
	return l, nil
}

// openTail builds a followed file's lane.
func (s *Source) openTail(o pipeline.SplitOpening, t Tail, start int64) (pipeline.Lane, error) {
	dir, ok := s.objs.(LocalDir)
	if !ok {
		return nil, spate.Fatalf("filesource: split %s follows the file %s, but the input %s is not a local directory", o.Spec.ID, t.Name, s.objs.Location())
	}
	var ts tailState
	if o.Progress != nil {
		var err error
		if ts, err = decodeTailState(o.Progress.State); err != nil {
			return nil, err
		}
	}
	l := &tailLane{
		id: o.Lane, part: o.Partition, split: o.Spec.ID, root: dir.LocalRoot(), want: t,
		issuer: o.Issuer, poison: o.Poison, log: s.log, name: t.Name, maxLine: s.maxLine, follow: s.follow,
		pos: start, base: ts.Base, bases: []baseFrom{{from: 0, base: ts.Base}}, committed: ts.Size, resumePrint: ts.Print,
	}
	l.onExhausted = func() {
		s.mu.Lock()
		s.finishing = append(s.finishing, o.Spec.ID)
		s.mu.Unlock()
		o.Waker.Wake()
	}
	s.mu.Lock()
	l.final = s.final
	s.splits[o.Spec.ID] = &splitState{tail: l, acked: start}
	s.mu.Unlock()
	return l, nil
}

func (s *Source) state(id spate.SplitID) *splitState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.splits[id]
}

// EncodeCommit reports completion once the watermark covers the whole
// split.
func (s *Source) EncodeCommit(id spate.SplitID, watermark int64) (spate.SplitProgress, error) {
	st := s.state(id)
	if st == nil {
		return spate.SplitProgress{}, spate.Fatalf("filesource: commit for split %s, which is not open", id)
	}
	s.mu.Lock()
	st.acked = max(st.acked, watermark)
	s.mu.Unlock()
	if st.tail != nil {
		p := st.tail.progress(watermark)
		s.mu.Lock()
		st.parked = p.Parked
		s.mu.Unlock()
		return p, nil
	}
	s.mu.Lock()
	total := st.total
	s.mu.Unlock()
	if watermark >= total {
		// A range's last line may end beyond its end.
		return spate.CompletedProgress(max(watermark, total), nil), nil
	}
	p := spate.NewSplitProgress(watermark, nil)
	p.Remaining = uint64(total - watermark) // bytes, the weight's unit: the division trigger's hint
	return p, nil
}

// Sweep completes a split whose every byte is already committed (an empty
// split, a resumed split that was fully read).
func (s *Source) Sweep(id spate.SplitID) (*spate.SplitProgress, error) {
	st := s.state(id)
	if st == nil {
		return nil, nil
	}
	s.mu.Lock()
	acked := st.acked
	done := st.acked >= st.total
	total := st.total
	s.mu.Unlock()
	if !done && st.lane != nil {
		done = st.lane.ownsNoLine()
	}
	if st.tail != nil {
		if !st.tail.complete(acked) {
			// A followed file that parked (or woke) since the last commit:
			// the coordination driver commits the change, so the lane is freed (taken).
			s.mu.Lock()
			was := st.parked
			s.mu.Unlock()
			if st.tail.isParkedAt(acked) == was {
				return nil, nil
			}
		}
		p := st.tail.progress(acked)
		s.mu.Lock()
		st.parked = p.Parked
		s.mu.Unlock()
		return &p, nil
	}
	if done {
		// As in EncodeCommit: a range's last line may end beyond its end,
		// and a completion carrying that watermark may have landed
		// though its reply was lost; completing at the range's end would
		// move the watermark back.
		p := spate.CompletedProgress(max(acked, total), nil)
		return &p, nil
	}
	return nil, nil
}

// CloseSplit detaches the tenancy's lane.
func (s *Source) CloseSplit(id spate.SplitID) {
	s.mu.Lock()
	st := s.splits[id]
	delete(s.splits, id)
	s.mu.Unlock()
	switch {
	case st == nil:
	case st.tail != nil:
		st.tail.close()
	default:
		st.lane.close()
	}
}

// TakeFinishing returns the splits whose lanes reached end of input.
func (s *Source) TakeFinishing() []spate.SplitID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.finishing
	s.finishing = nil
	return out
}

// BeginRevoke accepts every revocation: the coordination driver stops
// polling the lane between two batches and commits what it emitted once
// acknowledged, and a line is never cut, so any batch boundary is a clean
// one.
func (s *Source) BeginRevoke(spate.SplitID) bool { return true }

// Unfinished reports whether the split's lane has input left to read.
// A followed file's split is never unfinished at a stop: it hands back
// at the next line, and a later run follows the file from there.
func (s *Source) Unfinished(id spate.SplitID) bool {
	st := s.state(id)
	return st != nil && st.lane != nil && st.lane.unfinished()
}

// lane reads one split's lines.
//
// It reads each member in large blocks into a buffer of its own and cuts
// the lines out of it: a batch's values point into the buffer and its keys
// into a key arena, both reused from one poll to the next (the runtime is
// done with a batch's payloads before the lane's next poll), so a line
// costs no allocation and no copy here.
type lane struct {
	id      pipeline.LaneID
	part    pipeline.PartitionID
	split   spate.SplitID
	objs    Objects
	files   []Member
	maxLine int // the line cap
	// origin is the file offset of split offset 0: a range's start (0 for
	// whole files). limit is the split offset at or beyond which no line
	// start is the split's (a range's length; -1: none).
	origin, limit int64
	issuer        *pipeline.AckIssuer
	poison        func(string)
	onExhausted   func()

	mu      sync.Mutex
	pos     int64 // split offset of the next line not yet emitted
	emitted int64 // end of the last emitted line
	fileIdx int   // member being read; -1 before positioning
	base    int64 // split offset of the member's first byte
	f       io.ReadCloser
	// buf[r:w] holds the member's bytes from pos on, read and not yet
	// emitted; unread counts the member's bytes not yet read into buf.
	buf      []byte
	r, w     int
	unread   int64
	keys     []byte // this poll's keys
	payloads []pipeline.RawPayload
	started  bool
	// readFailures counts failed opens and reads since the last line read.
	readFailures int
	// skipping: a range that does not begin with a line start is reading
	// up to the first one (its bytes are the previous range's line).
	skipping bool
	// noLine: the range holds no line start; its split is complete.
	noLine bool
	// dividing: a runtime division is in flight (divide.go); whole is the
	// limit before it, restored if the coordinator refuses it.
	dividing  bool
	whole     int64
	exhausted bool
	stopped   bool
	failed    bool
}

// laneBufSize is a lane's read size and initial buffer; a line longer than
// the buffer grows it.
const laneBufSize = 256 << 10

func (l *lane) ID() pipeline.LaneID             { return l.id }
func (l *lane) Partition() pipeline.PartitionID { return l.part }

// Poll reads up to maxRecords lines.
func (l *lane) Poll(maxRecords int, timeout time.Duration) (*pipeline.Batch, error) {
	l.mu.Lock()
	if l.stopped || l.exhausted || l.failed {
		l.mu.Unlock()
		time.Sleep(timeout)
		return nil, nil
	}
	if !l.started {
		l.started = true
		if l.pos == 0 && l.origin > 0 {
			// Read from the byte before the range: a newline there makes
			// the range begin with a line; else its first bytes are the
			// end of the previous range's line.
			l.pos, l.skipping = -1, true
		}
		if err := l.position(); err != nil {
			l.failLocked(err)
			l.mu.Unlock()
			return nil, nil
		}
	}
	// The previous batch's payloads are no longer used: their memory is
	// this poll's.
	l.payloads = l.payloads[:0]
	l.keys = l.keys[:0]
	if l.r == l.w {
		l.r, l.w = 0, 0
	}
	for len(l.payloads) < maxRecords {
		if l.limit >= 0 && l.pos >= l.limit && !l.skipping {
			// The next line starts after the range: the next range's.
			l.closeFile()
			l.fileIdx = len(l.files)
			break
		}
		if l.f == nil {
			if l.fileIdx >= len(l.files) {
				break
			}
			if err := l.openCurrent(); err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errDrift) {
					l.failLocked(err)
				} else {
					l.readFailedLocked(err)
				}
				break
			}
			if l.f == nil {
				continue // an empty member
			}
		}
		if l.skipping {
			if i := bytes.IndexByte(l.buf[l.r:l.w], '\n'); i >= 0 {
				l.r += i + 1
				l.pos += int64(i + 1)
				l.endSkip()
				continue
			}
			// No line starts in what is buffered: drop it (no value of
			// this poll points into the buffer yet).
			l.pos += int64(l.w - l.r)
			l.r, l.w = 0, 0
			if l.unread == 0 {
				l.endSkip() // the file ends inside the previous range's line
				l.nextFile()
				continue
			}
			if err := l.fill(); err != nil {
				l.readFailedLocked(err)
				break
			}
			continue
		}
		if i := bytes.IndexByte(l.buf[l.r:l.w], '\n'); i >= 0 {
			if i > l.maxLine {
				l.failLocked(l.tooLong())
				break
			}
			l.emit(i+1, i)
			continue
		}
		if l.unread == 0 {
			// The member is read to its planned size: what is left is its
			// last line, without a newline.
			if n := l.w - l.r; n > l.maxLine {
				l.failLocked(l.tooLong())
				break
			} else if n > 0 {
				l.emit(n, n)
			}
			l.nextFile()
			continue
		}
		if l.w == len(l.buf) && l.r == 0 && l.w > l.maxLine {
			// The buffer holds more than the cap of one line, and no
			// newline.
			l.failLocked(l.tooLong())
			break
		}
		if l.w == len(l.buf) && !l.makeRoom() {
			break // this batch's values fill the buffer: the next poll reads on
		}
		if err := l.fill(); err != nil {
			// Nothing of a line cut short by a failed read is emitted.
			l.readFailedLocked(err)
			break
		}
	}
	if len(l.payloads) == 0 {
		if !l.failed && l.fileIdx >= len(l.files) {
			// Decided only on an empty poll after the last batch.
			l.exhausted = true
			l.closeFile()
			l.mu.Unlock()
			l.onExhausted()
			return nil, nil
		}
		backoff := l.readFailures > 0
		l.mu.Unlock()
		if backoff {
			time.Sleep(timeout)
		}
		return nil, nil
	}
	l.emitted = l.pos
	last := l.payloads[len(l.payloads)-1].Offset
	payloads := l.payloads
	l.mu.Unlock()
	return &pipeline.Batch{Payloads: payloads, Ack: l.issuer.Issue(l.part, last)}, nil
}

// endSkip ends a range's skip at pos, the first line start at or after
// its beginning (or the file's end).
func (l *lane) endSkip() {
	l.skipping = false
	if l.pos >= l.limit {
		l.noLine = true
	}
}

// ownsNoLine reports whether the lane found that its range holds no line
// start: its split is complete with nothing read.
func (l *lane) ownsNoLine() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.noLine
}

// emit cuts the next line, n bytes of which the first value are the line's
// own (n less its newline, if any), out of the buffer.
func (l *lane) emit(n, value int) {
	start := l.pos - l.base
	name := l.files[l.fileIdx].Name
	if need := len(name) + 21; len(l.keys)+need > cap(l.keys) {
		// A new arena: the keys cut so far keep the old one.
		l.keys = make([]byte, 0, max(2*cap(l.keys), 16<<10, need))
	}
	k := len(l.keys)
	l.keys = append(l.keys, name...)
	l.keys = append(l.keys, ':')
	l.keys = strconv.AppendInt(l.keys, start, 10)
	l.readFailures = 0
	l.pos += int64(n)
	l.payloads = append(l.payloads, pipeline.RawPayload{
		Key:       l.keys[k:len(l.keys):len(l.keys)],
		Value:     l.buf[l.r : l.r+value : l.r+value],
		Partition: l.part,
		Offset:    l.pos - 1,
	})
	l.r += n
}

// makeRoom frees the buffer's end for a read: it moves the unemitted
// bytes to the front, or grows the buffer when they fill it (a line longer
// than the buffer). It reports false when this poll's values still use
// the buffer.
func (l *lane) makeRoom() bool {
	if len(l.payloads) > 0 {
		return false
	}
	if l.r > 0 {
		l.w = copy(l.buf, l.buf[l.r:l.w])
		l.r = 0
		return true
	}
	grown := make([]byte, min(2*len(l.buf), l.maxLine+1))
	l.w = copy(grown, l.buf[:l.w])
	l.buf = grown
	return true
}

// tooLong is the error of a line over the cap that starts at pos.
func (l *lane) tooLong() error {
	return lineTooLong(l.files[l.fileIdx].Name, l.pos-l.base, l.maxLine)
}

// lineTooLong is the error of a line over the cap.
func lineTooLong(name string, off int64, maxLine int) error {
	return fmt.Errorf("%s: the line at byte offset %d is longer than the line cap of %d bytes (a lane holds a whole line in memory); "+
		"raise the cap (--max-line-bytes, filesource MaxLineBytes) and requeue the split, or split the line", quoteName(name), off, maxLine)
}

// fill reads the member's next block after buf[l.w:].
func (l *lane) fill() error {
	want := int(min(int64(len(l.buf)-l.w), l.unread))
	var n int
	var err error
	for range 100 { // a reader that returns nothing, again and again, is broken
		if n, err = l.f.Read(l.buf[l.w : l.w+want]); n > 0 || err != nil {
			break
		}
	}
	if n == 0 && err == nil {
		err = io.ErrNoProgress
	}
	l.w += n
	l.unread -= int64(n)
	switch {
	case err == io.EOF && l.unread > 0:
		// The stream ended before the planned size: the object shrank
		// (the reopen finds that out and makes the split poison) or a
		// transfer was cut short (the reopen resumes it).
		return fmt.Errorf("%s ended %d bytes before its planned size", quoteName(l.files[l.fileIdx].Name), l.unread)
	case err == io.EOF:
		return nil
	}
	return err
}

// position finds the member holding pos.
func (l *lane) position() error {
	base := -l.origin // a range's split offsets start at its start
	for i, f := range l.files {
		if l.pos < base+f.Size {
			l.fileIdx, l.base = i, base
			return nil
		}
		base += f.Size
	}
	l.fileIdx, l.base = len(l.files), base
	return nil
}

func (l *lane) openCurrent() error {
	m := l.files[l.fileIdx]
	if m.Size == 0 {
		l.nextFile()
		return nil
	}
	f, size, err := l.objs.Open(context.Background(), m.Name, l.pos-l.base)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is gone (deleted or renamed under the job; %d bytes planned): %w", quoteName(m.Name), m.Size, err)
	}
	if err != nil {
		return err
	}
	if size < m.Size {
		f.Close()
		return fmt.Errorf("%w: %s is %d bytes, planned %d", errDrift, quoteName(m.Name), size, m.Size)
	}
	if l.buf == nil {
		l.buf = make([]byte, laneBufSize)
	}
	l.f = f
	l.unread = m.Size - (l.pos - l.base)
	return nil
}

func (l *lane) nextFile() {
	l.closeFile()
	if l.fileIdx < len(l.files) {
		l.base += l.files[l.fileIdx].Size
		l.fileIdx++
	}
}

// closeFile closes the member and drops what is buffered of it (the next
// open reads on from pos).
func (l *lane) closeFile() {
	if l.f != nil {
		l.f.Close()
	}
	l.f = nil
	l.r = l.w
	l.unread = 0
}

// maxReadRetries is how many failed opens or reads in a row a lane
// retries (one per poll, from the start of the line it was reading) before
// it reports the split poison. It rides out a dropped connection to a
// bucket; a missing or shrunken object is poison at once.
const maxReadRetries = 5

// errDrift marks an object that no longer matches the plan.
var errDrift = errors.New("the input changed since it was planned")

// readFailedLocked closes the reader, keeping the position at the start
// of the line that was being read, so that the next poll reopens there.
func (l *lane) readFailedLocked(err error) {
	l.closeFile()
	l.readFailures++
	if l.readFailures > maxReadRetries {
		l.failLocked(fmt.Errorf("%s: %d opens or reads in a row failed, the last with: %w",
			quoteName(l.files[l.fileIdx].Name), l.readFailures, err))
	}
}

func (l *lane) failLocked(err error) {
	l.failed = true
	l.closeFile()
	if errors.Is(err, context.Canceled) {
		return
	}
	reason := fmt.Sprintf("split %s: %v", l.split, err)
	if l.poison != nil {
		// The report only queues and wakes: safe under the lane lock.
		l.poison(reason)
	}
}

func (l *lane) close() {
	l.mu.Lock()
	l.stopped = true
	l.closeFile()
	l.mu.Unlock()
}

func (l *lane) unfinished() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.exhausted && !l.stopped && !l.failed
}
