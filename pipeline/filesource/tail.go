package filesource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// tailState is a tail split's resume state beside its watermark. Base is
// the split offset of the file's byte 0: 0 until the file is first
// truncated, then the split offset where its new content starts (split
// offsets never go back, so a watermark stays monotonic through a
// truncation). Size is the file's size when the commit was made: the
// commit's lag is Size-(Watermark-Base).
type tailState struct {
	Base int64 `json:"base,omitempty"`
	Size int64 `json:"size,omitempty"`
	// Name is where the file is now, when it was renamed since it was
	// found; End is why its split completed (see lag.go).
	Name string `json:"name,omitempty"`
	End  string `json:"end,omitempty"`
	// Print is the CRC-32 (hex) of the up to printLen bytes before the
	// committed file offset, as the lane read them: a lane that resumes
	// the split checks the file still holds them there, and reads a file
	// that was truncated and written past that offset again (copytruncate
	// while no worker held the split) from its start. Absent when
	// unknown (the file was truncated since, or nothing was committed).
	Print string `json:"print,omitempty"`
}

// printLen is how many bytes before a committed offset tailState.Print covers.
const printLen = 64

func decodeTailState(b []byte) (tailState, error) {
	var st tailState
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("filesource: bad tail state %q: %w", b, err)
	}
	if st.Base < 0 {
		return st, fmt.Errorf("filesource: bad tail state %q", b)
	}
	return st, nil
}

// growthPoll is how often a lane at the end of its file looks for more.
const growthPoll = 50 * time.Millisecond

// tailLane follows one file as it grows. It reads whole lines only: a last
// line still being written waits for its newline, unless the file ends
// for good (the plan is final, the file was deleted or truncated), when
// it is emitted as it is.
type tailLane struct {
	id          pipeline.LaneID
	part        pipeline.PartitionID
	split       spate.SplitID
	root        string
	want        Tail
	maxLine     int // the line cap
	issuer      *pipeline.AckIssuer
	poison      func(string)
	onExhausted func()
	log         *slog.Logger
	follow      *followState // the patterns, ReleaseAfter, and the listings to ask for
	// committed is the file's size the resumed commit recorded (0 when
	// unknown): what of it a truncation or deletion while nobody held the
	// split took from under the lane.
	committed int64
	// resumePrint is the resumed commit's Print ("" when it has none).
	resumePrint string

	mu sync.Mutex
	// printAt and print are the last Print computed, at that watermark.
	printAt int64
	print   string
	f       *os.File
	name    string // where the file was found: the want's name, or its new name
	pos     int64  // split offset of the next byte not yet emitted
	base    int64  // split offset of the file's byte 0
	bases   []baseFrom
	buf     []byte // buf[r:w]: the file's bytes from pos on, read, not emitted
	r, w    int
	size    int64 // the file's size when last seen
	checked time.Time
	keys    []byte
	pays    []pipeline.RawPayload
	final   bool // the plan is final: end at the end of the file
	outside bool // the file was moved out of the root
	sniff   bool // the next bytes read are the file's first: check they are text
	started bool
	parked  bool   // idle past ReleaseAfter at its end: its split takes no lane until the file grows
	missed  int    // parked and closed: looks in a row that found the file nowhere under the root
	done    bool   // the file ended for good: every byte emitted
	end     string // why it ended
	stopped bool
	failed  bool
}

// baseFrom: watermarks from from on resume with base.
type baseFrom struct{ from, base int64 }

func (l *tailLane) ID() pipeline.LaneID             { return l.id }
func (l *tailLane) Partition() pipeline.PartitionID { return l.part }

// Poll reads up to maxRecords whole lines.
func (l *tailLane) Poll(maxRecords int, timeout time.Duration) (*pipeline.Batch, error) {
	l.mu.Lock()
	if l.stopped || l.done || l.failed {
		l.mu.Unlock()
		time.Sleep(timeout)
		return nil, nil
	}
	if !l.started {
		l.started = true
		if err := l.open(); err != nil {
			l.failLocked(err)
			l.mu.Unlock()
			return nil, nil
		}
		if l.done {
			l.mu.Unlock()
			l.onExhausted()
			return nil, nil
		}
	}
	l.pays, l.keys = l.pays[:0], l.keys[:0]
	if l.f == nil && !l.done {
		// Parked with its descriptor closed: reopened once the file grew.
		if err := l.wake(); err != nil {
			l.failLocked(err)
		}
	}
	if l.r > 0 {
		l.w = copy(l.buf, l.buf[l.r:l.w])
		l.r = 0
	}
	for len(l.pays) < maxRecords && l.f != nil {
		if i := bytes.IndexByte(l.buf[l.r:l.w], '\n'); i >= 0 {
			if i > l.maxLine {
				l.failLocked(lineTooLong(l.name, l.pos-l.base, l.maxLine))
				break
			}
			l.emit(i+1, i)
			continue
		}
		if l.w == len(l.buf) {
			if len(l.pays) > 0 {
				break // this batch's values fill the buffer
			}
			if l.w > l.maxLine { // no newline in more than the cap
				l.failLocked(lineTooLong(l.name, l.pos-l.base, l.maxLine))
				break
			}
			grown := make([]byte, min(2*len(l.buf), l.maxLine+1)) // a line longer than the buffer
			copy(grown, l.buf[:l.w])
			l.buf = grown
		}
		n, err := l.f.Read(l.buf[l.w:])
		l.w += n
		if n > 0 {
			if l.parked {
				l.unpark()
			}
			if l.sniff {
				l.sniff = false
				if why := notText(l.buf[l.r:l.w]); why != "" {
					l.refuse(why)
					break
				}
			}
			continue
		}
		if err != nil && err != io.EOF {
			l.failLocked(fmt.Errorf("read %s: %w", l.name, err))
			break
		}
		// At the end of what the file holds now.
		if len(l.pays) > 0 || time.Since(l.checked) < growthPoll {
			break
		}
		l.checked = time.Now()
		if ended, err := l.atEnd(); err != nil {
			l.failLocked(err)
			break
		} else if ended {
			break
		}
	}
	if len(l.pays) == 0 {
		done := l.done
		l.mu.Unlock()
		if done {
			l.onExhausted()
			return nil, nil
		}
		time.Sleep(min(timeout, growthPoll))
		return nil, nil
	}
	pays := l.pays
	last := pays[len(pays)-1].Offset
	l.mu.Unlock()
	return &pipeline.Batch{Payloads: pays, Ack: l.issuer.Issue(l.part, last)}, nil
}

// atEnd looks at the file once the lane has read all it holds: a final
// plan or a deleted file ends the split; a file smaller than what was read
// was truncated, and is read again from its start. It reports whether the
// split ended.
func (l *tailLane) atEnd() (bool, error) {
	info, err := l.f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", l.name, err)
	}
	read := l.pos - l.base + int64(l.w-l.r) // file offset of the next byte to read
	seen := l.size                          // the size the lane last saw
	l.size = info.Size()
	switch nlink, ok := links(info); {
	case info.Size() < read:
		if unread := seen - read; unread > 0 {
			l.log.Warn("a followed file was truncated before all its bytes were read: they cannot be read; it is read again from its start",
				"file", quoteName(l.name), "split", l.split, "unread_bytes", unread, "read_bytes", read, "size", info.Size())
		} else {
			l.log.Info("a followed file was truncated (copytruncate?): it is read again from its start; lines written between the last read and the truncation, if any, were not read",
				"file", quoteName(l.name), "split", l.split, "read_bytes", read, "size", info.Size())
		}
		l.sniff = true
		if err := l.flushPartial(); err != nil {
			return false, err
		}
		l.base = l.pos
		l.bases = append(l.bases, baseFrom{from: l.pos, base: l.base})
		if _, err := l.f.Seek(0, io.SeekStart); err != nil {
			return false, fmt.Errorf("seek %s: %w", l.name, err)
		}
		return false, nil
	case l.final:
		if err := l.flushPartial(); err != nil {
			return false, err
		}
		l.done, l.end = true, endFinal
		return true, nil
	case ok && nlink == 0:
		l.log.Info("a followed file was deleted: its split completes at the end of what it held", "file", quoteName(l.name), "split", l.split)
		if err := l.flushPartial(); err != nil {
			return false, err
		}
		l.done, l.end = true, endDeleted
		return true, nil
	}
	l.checkName()
	if !l.parked && l.follow.releaseAfter > 0 && time.Since(info.ModTime()) >= l.follow.releaseAfter {
		// Idle at its end: the split parks. It stays this lane's (nothing
		// is read twice, nothing left behind) but takes none of the
		// worker's lanes, so a live file waiting for one gets it; the next
		// bytes the file gets take the lane back.
		renamed := l.releasable()
		if renamed {
			// Renamed away (or left out by the patterns): its writer has
			// moved on, so a last line without a newline is whole.
			if err := l.flushPartial(); err != nil {
				return false, err
			}
		}
		l.parked = true
		l.letGo()
		idle := time.Since(info.ModTime()).Round(time.Second)
		if renamed {
			l.log.Info("parked a followed file that was renamed away and is idle: read to its end, it frees its lane; its split resumes if it grows again, and completes when it is deleted",
				"file", quoteName(l.name), "found_as", quoteName(l.want.Name), "split", l.split, "bytes", info.Size(), "idle", idle)
		} else {
			// A quiet log parks and wakes often: not worth an INFO each time.
			l.log.Debug("parked an idle followed file: it frees its lane until it grows again",
				"file", quoteName(l.name), "split", l.split, "bytes", info.Size(), "idle", idle)
		}
	}
	return false, nil
}

// letGo closes a parked file's descriptor (and frees its buffer when it
// holds nothing unread), so that a worker with many parked files does not
// hold one descriptor each: wake opens it again when it grows. A file
// moved out of the root, or on a platform without file identities, stays
// open: it could not be found again with certainty.
func (l *tailLane) letGo() {
	if l.outside || l.f == nil {
		return
	}
	if _, err := identifyOpen(l.f); err != nil {
		return
	}
	l.closeLocked()
	if l.r == l.w {
		l.buf, l.r, l.w = nil, 0, 0
	}
}

// wake looks at a parked file whose descriptor letGo closed, every
// growthPoll: at its name, or (renamed) wherever under the root its
// identity is now. Once it has grown, shrunk (a truncation) or the plan
// turned final, it is opened again, checked to be the same file, and read
// on from where the lane stopped; a file that is nowhere under the root
// any more (deleted, or moved out while parked) ends the split at the end
// of what was read.
func (l *tailLane) wake() error {
	if time.Since(l.checked) < growthPoll {
		return nil
	}
	l.checked = time.Now()
	path := filepath.Join(l.root, filepath.FromSlash(l.name))
	if id, err := identify(path); err != nil || id != l.want.FileID {
		now, ok := l.lookup()
		if !ok {
			// A walk racing a rename (logrotate's .1 → .2) can miss the
			// file once: gone only when two looks in a row miss it.
			if l.missed++; l.missed < 2 {
				return nil
			}
			l.log.Info("a parked followed file is gone (deleted, or moved out of the input): its split completes at the end of what was read",
				"file", quoteName(l.name), "split", l.split)
			if err := l.flushPartial(); err != nil {
				return err
			}
			l.done, l.end = true, endDeleted
			return nil
		}
		l.log.Info("a followed file was renamed (a rotation?): its split goes on reading it under its new name; a new file at the old name is new work",
			"file", quoteName(l.name), "now", quoteName(now), "split", l.split)
		l.name = now
		l.follow.ask()
		path = filepath.Join(l.root, filepath.FromSlash(l.name))
	}
	l.missed = 0
	info, err := os.Stat(path)
	if err != nil {
		return nil // renamed or deleted since: the next look finds out
	}
	read := l.pos - l.base + int64(l.w-l.r) // file offset of the next byte to read
	if info.Size() == read && !l.final {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	if id, err := identifyOpen(f); err != nil || id != l.want.FileID {
		f.Close()
		return nil // replaced since the look: the next look finds it
	}
	if _, err := f.Seek(read, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("seek %s: %w", l.name, err)
	}
	l.f = f
	if l.buf == nil {
		l.buf = make([]byte, laneBufSize)
	}
	l.checked = time.Time{} // a shrunk file is seen at the first look at its end
	return nil
}

// unpark takes the lane back for a parked file that grew: worth an INFO
// for a file renamed away (its writer had not moved on after all).
func (l *tailLane) unpark() {
	l.parked = false
	level := slog.LevelDebug
	if l.releasable() {
		level = slog.LevelInfo
	}
	l.log.Log(context.Background(), level, "a parked followed file grew: its split takes a lane again, reading on from where it stopped",
		"file", quoteName(l.name), "split", l.split)
}

// releasable reports whether the file is one a rotation left behind: it
// was renamed (or moved out of the input), or the patterns leave it out.
func (l *tailLane) releasable() bool {
	if l.follow.releaseAfter <= 0 {
		return false
	}
	return l.outside || l.name != l.want.Name || !l.follow.filter.match(l.name)
}

// refuse ends the split of a file whose first bytes are not text (why):
// none of it is shipped, and one warning names it.
func (l *tailLane) refuse(why string) {
	l.log.Warn("refused to follow a file that is not text: none of its bytes are shipped; leave it out with --exclude (filesource Exclude) to silence this",
		"file", quoteName(l.name), "split", l.split, "found", why, "bytes", l.size)
	l.r = l.w
	l.done, l.end = true, endRefused
	l.closeLocked()
}

// checkName notices that the followed file no longer is at its name (it
// was renamed: a rotation), says so once, and follows it under its new
// name; the file at the old name, if any, is new work for the planner.
func (l *tailLane) checkName() {
	if l.outside {
		return
	}
	id, err := identify(filepath.Join(l.root, filepath.FromSlash(l.name)))
	if err == nil && id == l.want.FileID {
		return
	}
	now, ok := l.lookup()
	if !ok {
		// Moved out of the root: read on from the open file, and look no
		// more (a walk of the root at every look would cost the root).
		l.outside = true
		l.log.Info("a followed file was moved out of the input: its split goes on reading the open file", "file", quoteName(l.name), "split", l.split)
		l.follow.ask()
		return
	}
	l.log.Info("a followed file was renamed (a rotation?): its split goes on reading it under its new name; a new file at the old name is new work",
		"file", quoteName(l.name), "now", quoteName(now), "split", l.split)
	l.name = now
	l.follow.ask() // a new file at the old name is likely: list now
}

// lookup finds the wanted file under the root by its identity.
func (l *tailLane) lookup() (string, bool) {
	var found string
	_ = filepath.WalkDir(l.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return nil
		}
		if id, ierr := identify(path); ierr == nil && id == l.want.FileID {
			if rel, rerr := filepath.Rel(l.root, path); rerr == nil {
				found = filepath.ToSlash(rel)
			}
		}
		return nil
	})
	return found, found != ""
}

// flushPartial emits the bytes after the last newline as a line: the file
// ended without one.
func (l *tailLane) flushPartial() error {
	n := l.w - l.r
	if n > l.maxLine {
		return lineTooLong(l.name, l.pos-l.base, l.maxLine)
	}
	if n > 0 {
		l.emit(n, n)
	}
	return nil
}

// open finds the file (by its identity, where its name now holds
// another), and seeks to the resume point. A file that is gone ends the
// split (there is nothing left to read); a file smaller than the resume
// point was truncated while nobody held the split, and is read from its
// start.
func (l *tailLane) open() error {
	f, err := l.find()
	if errors.Is(err, fs.ErrNotExist) {
		if unread := l.committed - (l.pos - l.base); unread > 0 {
			l.log.Warn("a followed file was deleted while no worker held its split, with bytes its last commit had not reached: they cannot be read; the split completes at its last commit",
				"file", quoteName(l.want.Name), "split", l.split, "unread_bytes", unread, "watermark", l.pos)
		} else {
			l.log.Info("a followed file was deleted while no worker held its split: the split completes at its last commit",
				"file", quoteName(l.want.Name), "split", l.split, "watermark", l.pos)
		}
		l.done, l.end = true, endGone
		return nil
	}
	if err != nil {
		return err
	}
	l.f = f
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", l.name, err)
	}
	l.size = info.Size()
	off := l.pos - l.base
	if info.Size() < off {
		if unread := l.committed - off; unread > 0 {
			l.log.Warn("a followed file was truncated while no worker held its split, with bytes its last commit had not reached: they cannot be read; it is read again from its start",
				"file", quoteName(l.name), "split", l.split, "unread_bytes", unread, "resume_offset", off, "size", info.Size())
		} else {
			l.log.Info("a followed file was truncated while no worker held its split: it is read again from its start",
				"file", quoteName(l.name), "split", l.split, "resume_offset", off, "size", info.Size())
		}
		l.base = l.pos
		l.bases = append(l.bases, baseFrom{from: l.pos, base: l.base})
		off = 0
	}
	if off > 0 {
		// The bytes before the resume point must be those the last commit
		// read (its Print), or at least end a line (a commit without one):
		// else the file was truncated while nobody held the split and
		// written past the resume point since (copytruncate). It is read
		// again from its start, as a file found smaller is.
		n := min(off, printLen)
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off-n); err != nil {
			return fmt.Errorf("resume check of %s: %w", l.name, err)
		}
		sum := fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
		if l.resumePrint != "" && sum != l.resumePrint || l.resumePrint == "" && b[n-1] != '\n' {
			l.log.Warn("a followed file was truncated and written again while no worker held its split: the bytes its last commit had not reached cannot be read; it is read again from its start",
				"file", quoteName(l.name), "split", l.split, "unread_bytes", max(l.committed-off, 0), "resume_offset", off, "size", info.Size())
			l.base = l.pos
			l.bases = append(l.bases, baseFrom{from: l.pos, base: l.base})
			off = 0
		} else {
			l.printAt, l.print = l.pos, sum
		}
	}
	if off == 0 {
		l.sniff = true
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return fmt.Errorf("seek %s: %w", l.name, err)
	}
	l.buf = make([]byte, laneBufSize)
	return nil
}

// find opens the wanted file: at its name if the file there is the one,
// else wherever under the root it was renamed to.
func (l *tailLane) find() (*os.File, error) {
	open := func(name string) (*os.File, bool, error) {
		f, err := os.Open(filepath.Join(l.root, filepath.FromSlash(name)))
		if err != nil {
			return nil, false, err
		}
		id, err := identifyOpen(f)
		if err != nil {
			f.Close()
			return nil, false, err
		}
		if id != l.want.FileID {
			f.Close()
			return nil, false, nil
		}
		l.name = name
		return f, true, nil
	}
	f, ok, err := open(l.want.Name)
	switch {
	case ok:
		return f, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	// Renamed: look for it by identity.
	found, ok := l.lookup()
	if !ok {
		return nil, fs.ErrNotExist
	}
	if f, ok, err = open(found); err != nil || !ok {
		return nil, fs.ErrNotExist // gone again meanwhile
	}
	l.log.Info("a followed file was renamed; following it at its new name", "file", quoteName(l.want.Name), "now", quoteName(found), "split", l.split)
	return f, nil
}

// emit cuts the next line (n bytes, value of them the line's own).
func (l *tailLane) emit(n, value int) {
	off := l.pos - l.base
	need := len(l.want.Name) + 42
	if len(l.keys)+need > cap(l.keys) {
		l.keys = make([]byte, 0, max(2*cap(l.keys), 16<<10, need))
	}
	k := len(l.keys)
	l.keys = append(l.keys, l.want.Name...)
	if l.base > 0 {
		l.keys = append(l.keys, '~')
		l.keys = strconv.AppendInt(l.keys, l.base, 10)
	}
	l.keys = append(l.keys, ':')
	l.keys = strconv.AppendInt(l.keys, off, 10)
	l.pos += int64(n)
	l.pays = append(l.pays, pipeline.RawPayload{
		Key:       l.keys[k:len(l.keys):len(l.keys)],
		Value:     l.buf[l.r : l.r+value : l.r+value],
		Partition: l.part,
		Offset:    l.pos - 1,
	})
	l.r += n
}

// baseFor is the base a commit at watermark resumes with.
func (l *tailLane) baseFor(watermark int64) int64 {
	b := int64(0)
	for _, e := range l.bases {
		if e.from <= watermark {
			b = e.base
		}
	}
	return b
}

// progress is the split's progress at watermark: complete once the file
// ended for good and every byte of it is acknowledged.
func (l *tailLane) progress(watermark int64) spate.SplitProgress {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := tailState{Base: l.baseFor(watermark), Size: l.size, Print: l.printOf(watermark)}
	if l.name != l.want.Name {
		ts.Name = l.name
	}
	if l.done && watermark >= l.pos {
		ts.End = l.end
		st, _ := json.Marshal(ts)
		return spate.CompletedProgress(watermark, st)
	}
	st, _ := json.Marshal(ts)
	p := spate.NewSplitProgress(watermark, st)
	p.Parked = l.parkedAt(watermark)
	return p
}

// printOf is tailState.Print at watermark: the CRC-32 of the bytes the
// file holds before its offset, read again from the open file, while no
// truncation came after it ("" otherwise, or when the file is closed and
// the last Print was at another watermark).
func (l *tailLane) printOf(watermark int64) string {
	if l.printAt == watermark && l.print != "" {
		return l.print
	}
	off := watermark - l.base
	if l.f == nil || off <= 0 || l.baseFor(watermark) != l.base || l.done {
		return ""
	}
	n := min(off, printLen)
	b := make([]byte, n)
	if _, err := l.f.ReadAt(b, off-n); err != nil {
		return ""
	}
	l.printAt, l.print = watermark, fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
	return l.print
}

// parkedAt reports whether the split is parked with every byte it emitted
// acknowledged up to watermark: only then does it give up its lane.
func (l *tailLane) parkedAt(watermark int64) bool {
	return l.parked && !l.done && watermark >= l.pos
}

// isParkedAt is parkedAt under the lane's lock.
func (l *tailLane) isParkedAt(watermark int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parkedAt(watermark)
}

// complete reports whether the split ended with every byte acknowledged
// up to acked.
func (l *tailLane) complete(acked int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done && acked >= l.pos
}

func (l *tailLane) setFinal() {
	l.mu.Lock()
	l.final = true
	l.checked = time.Time{}
	l.mu.Unlock()
}

// lag is the bytes the file held beyond what was emitted, when last seen.
func (l *tailLane) lag() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.size-(l.pos-l.base), 0)
}

func (l *tailLane) failLocked(err error) {
	l.failed = true
	l.closeLocked()
	if l.poison != nil {
		l.poison(fmt.Sprintf("split %s: %v", l.split, err))
	}
}

func (l *tailLane) closeLocked() {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

func (l *tailLane) close() {
	l.mu.Lock()
	l.stopped = true
	l.closeLocked()
	l.mu.Unlock()
}

// TailLag is a followed file's lag as its split's last commit recorded
// it: the bytes the file held beyond the commit's watermark. ok is false
// for progress that is not a followed file's (a bounded split's).
func TailLag(p spate.SplitProgress) (lag int64, ok bool) {
	if len(p.State) == 0 {
		return 0, false
	}
	st, err := decodeTailState(p.State)
	if err != nil || st.Size == 0 && st.Base == 0 {
		return 0, false
	}
	return max(st.Size-(p.Watermark-st.Base), 0), true
}
