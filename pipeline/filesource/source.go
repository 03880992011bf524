package filesource

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Source reads the splits of a [Planner]'s plan. It implements
// [pipeline.SplitSource] and [pipeline.StopReader].
type Source struct {
	root string
	mu   sync.Mutex
	// splits holds the open tenancies by split id.
	splits    map[spate.SplitID]*splitState
	finishing []spate.SplitID
}

type splitState struct {
	lane  *lane
	total int64
	// acked is the highest watermark EncodeCommit saw (or the resume point).
	acked    int64
	draining bool
}

// NewSource reads files under root (the planner's root).
func NewSource(root string) *Source {
	return &Source{root: root, splits: map[spate.SplitID]*splitState{}}
}

// New assembles a coordinated backfill of root over coord.
func New[C spate.SplitCoordinator](root string, coord C, popts PlannerOptions, dopts ...pipeline.DriverOption) *pipeline.CoordinatedSource[C] {
	return pipeline.NewCoordinatedSource(coord, NewSource(root), NewPlanner(root, popts), dopts...)
}

// ValidateResume rejects progress that is not on a line boundary of the
// split (the files drifted, or the progress belongs elsewhere).
func (s *Source) ValidateResume(spec spate.SplitSpec, p spate.SplitProgress) error {
	d, err := DecodeDescriptor(spec.Descriptor)
	if err != nil {
		return err
	}
	total := d.Total()
	if p.Watermark < 0 || p.Watermark > total {
		return fmt.Errorf("filesource: resume watermark %d outside the split's %d bytes", p.Watermark, total)
	}
	var base int64
	for _, f := range d.Files {
		if p.Watermark > base && p.Watermark < base+f.Size {
			// Inside this file: the byte before it must end a line.
			fh, err := os.Open(filepath.Join(s.root, filepath.FromSlash(f.Name)))
			if err != nil {
				return fmt.Errorf("filesource: resume check: %w", err)
			}
			var b [1]byte
			_, err = fh.ReadAt(b[:], p.Watermark-base-1)
			fh.Close()
			if err != nil {
				return fmt.Errorf("filesource: resume check: %w", err)
			}
			if b[0] != '\n' {
				return fmt.Errorf("filesource: resume watermark %d is not on a line boundary of %s", p.Watermark, f.Name)
			}
			return nil
		}
		base += f.Size
	}
	return nil
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
	l := &lane{
		id: o.Lane, part: o.Partition, split: o.Spec.ID, root: s.root, files: d.Files,
		issuer: o.Issuer, poison: o.Poison, pos: start, emitted: start,
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

func (s *Source) state(id spate.SplitID) *splitState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.splits[id]
}

// EncodeCommit reports completion once the watermark covers the whole
// split (and the split is not draining).
func (s *Source) EncodeCommit(id spate.SplitID, watermark int64) (spate.SplitProgress, error) {
	st := s.state(id)
	if st == nil {
		return spate.SplitProgress{}, spate.Fatalf("filesource: commit for split %s, which is not open", id)
	}
	s.mu.Lock()
	st.acked = max(st.acked, watermark)
	draining := st.draining
	s.mu.Unlock()
	if watermark >= st.total && !draining {
		return spate.CompletedProgress(st.total, nil), nil
	}
	return spate.NewSplitProgress(watermark, nil), nil
}

// Sweep completes a split whose every byte is already committed (an empty
// split, a resumed split that was fully read).
func (s *Source) Sweep(id spate.SplitID) (*spate.SplitProgress, error) {
	st := s.state(id)
	if st == nil {
		return nil, nil
	}
	s.mu.Lock()
	done := st.acked >= st.total && !st.draining
	s.mu.Unlock()
	if done {
		p := spate.CompletedProgress(st.total, nil)
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
	if st != nil {
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

// BeginRevoke stops the lane's intake after its last emitted line.
func (s *Source) BeginRevoke(id spate.SplitID) bool {
	st := s.state(id)
	if st == nil {
		return false
	}
	st.lane.stopIntake()
	s.mu.Lock()
	st.draining = true
	s.mu.Unlock()
	return true
}

// DrainReady returns the final progress once every emitted line is
// acknowledged.
func (s *Source) DrainReady(id spate.SplitID) (*spate.SplitProgress, error) {
	st := s.state(id)
	if st == nil {
		return nil, nil
	}
	emitted := st.lane.emittedEnd()
	s.mu.Lock()
	acked := st.acked
	s.mu.Unlock()
	if acked < emitted {
		return nil, nil
	}
	p := spate.NewSplitProgress(emitted, nil)
	return &p, nil
}

// Unfinished reports whether the split's lane has input left to read.
func (s *Source) Unfinished(id spate.SplitID) bool {
	st := s.state(id)
	return st != nil && st.lane.unfinished()
}

// lane reads one split's lines.
type lane struct {
	id          pipeline.LaneID
	part        pipeline.PartitionID
	split       spate.SplitID
	root        string
	files       []Member
	issuer      *pipeline.AckIssuer
	poison      func(string)
	onExhausted func()

	mu        sync.Mutex
	pos       int64 // split offset of the next unread byte
	emitted   int64 // end of the last emitted line
	fileIdx   int   // member being read; -1 before positioning
	base      int64 // split offset of the member's first byte
	f         *os.File
	r         *bufio.Reader
	left      int64 // bytes of the member left to read
	started   bool
	exhausted bool
	stopped   bool
	failed    bool
}

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
		if err := l.position(); err != nil {
			l.failLocked(err)
			l.mu.Unlock()
			return nil, nil
		}
	}
	var payloads []pipeline.RawPayload
	for len(payloads) < maxRecords {
		if l.r == nil {
			if l.fileIdx >= len(l.files) {
				break
			}
			if err := l.openCurrent(); err != nil {
				l.failLocked(err)
				break
			}
			if l.r == nil {
				continue // an empty member
			}
		}
		start := l.pos - l.base
		line, err := l.r.ReadBytes('\n')
		if len(line) > 0 {
			l.pos += int64(len(line))
			l.left -= int64(len(line))
			value := line
			if value[len(value)-1] == '\n' {
				value = value[:len(value)-1]
			}
			payloads = append(payloads, pipeline.RawPayload{
				Key:       []byte(l.files[l.fileIdx].Name + ":" + strconv.FormatInt(start, 10)),
				Value:     value,
				Partition: l.part,
				Offset:    l.pos - 1,
			})
		}
		if err == io.EOF {
			if l.left > 0 {
				l.failLocked(fmt.Errorf("%s is shorter than planned (%d bytes missing)", l.files[l.fileIdx].Name, l.left))
				break
			}
			l.nextFile()
			continue
		}
		if err != nil {
			l.failLocked(err)
			break
		}
	}
	if len(payloads) == 0 {
		if !l.failed && l.fileIdx >= len(l.files) {
			// Decided only on an empty poll after the last batch.
			l.exhausted = true
			l.closeFile()
			l.mu.Unlock()
			l.onExhausted()
			return nil, nil
		}
		l.mu.Unlock()
		return nil, nil
	}
	l.emitted = l.pos
	last := payloads[len(payloads)-1].Offset
	l.mu.Unlock()
	return &pipeline.Batch{Payloads: payloads, Ack: l.issuer.Issue(l.part, last)}, nil
}

// position finds the member holding pos.
func (l *lane) position() error {
	var base int64
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
	f, err := os.Open(filepath.Join(l.root, filepath.FromSlash(m.Name)))
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err == nil && info.Size() < m.Size {
		err = fmt.Errorf("%s is %d bytes, planned %d", m.Name, info.Size(), m.Size)
	}
	if err == nil {
		_, err = f.Seek(l.pos-l.base, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return err
	}
	l.f = f
	l.left = m.Size - (l.pos - l.base)
	l.r = bufio.NewReaderSize(io.LimitReader(f, l.left), 64<<10)
	return nil
}

func (l *lane) nextFile() {
	l.closeFile()
	if l.fileIdx < len(l.files) {
		l.base += l.files[l.fileIdx].Size
		l.fileIdx++
	}
}

func (l *lane) closeFile() {
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.r = nil, nil
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

func (l *lane) stopIntake() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}

func (l *lane) close() {
	l.mu.Lock()
	l.stopped = true
	l.closeFile()
	l.mu.Unlock()
}

func (l *lane) emittedEnd() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.emitted
}

func (l *lane) unfinished() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.exhausted && !l.stopped && !l.failed
}
