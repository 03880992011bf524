package filesink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/atomicfile"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/internal/filehook"
)

// StagedFileSink is the exactly-once file sink: a [pipeline.StagingSink] that
// writes each split's output to one file named by the split,
// DIR/<split>.out, whoever owns the split, so a takeover appends where the
// split's output already is.
//
// A tenancy stages its lines in a file of its own under DIR/.spate/stage/
// (never read by anyone but a later owner). At each commit the staged
// bytes below the watermark are fsynced, and the committable lists them:
// the published length and CRC-32C of DIR/<split>.out, and the staged
// range with its checksum. Once that commit won, the range is copied to
// the published file at exactly the committed length and fsynced. A
// published file therefore only ever grows, by committed ranges, written at
// offsets the commits fixed: publishing again (a retry, a new owner
// finishing a crashed one's publish, a zombie waking up) writes the same
// bytes at the same place.
//
// A zombie (a process frozen past its lease) keeps its file descriptors,
// but the only file it may still write through them is its own staging
// file, past its committed ranges: nothing is published by renaming or
// truncating a file a writer may hold, and a new owner copies the ranges
// the committed record lists and never writes the old owner's staging
// file (it deletes it). Its commits are fenced, so nothing it stages after
// its last won commit is ever listed.
//
// Output is visible within a commit interval of being acknowledged, one
// file per split (no small files accumulate). A reader may see a committed
// range while it is being appended; a run interrupted at any point leaves
// every published file a prefix of its split's committed output, which the
// next owner completes.
//
// Damage is detected and costs only its split (the coordination driver sets
// the split aside with the error as the reason): a published file truncated,
// deleted, replaced, altered (its CRC no longer the committed one) or
// holding bytes no commit lists; a staging file listed by the committed
// record deleted or altered before its range was published; a published name
// already present when the split has no committed output. A marker
// DIR/.spate/job refuses a second job pointed at the same destination.
//
// Write stages without fsync; durability is at Prepare. Records of one
// split must reach the sink in offset order (the runtime shards by
// partition, so they do).
type StagedFileSink struct {
	dir string
	// Format renders one record onto buf (default: key, tab, value,
	// newline). Set it before the first write.
	Format func(buf []byte, r pipeline.Record) []byte
	// PublishWhole publishes each split's file whole, by renaming its
	// staging file, once the commit that completes the split (or hands it
	// back) won, instead of appending each commit's range to it: every
	// byte is written once rather than twice, but a split's output is
	// visible only once it completes. For bounded jobs; set it before the
	// first OpenStage (see stagedwhole.go for the layout and its safety).
	PublishWhole bool

	noSpace atomic.Int32 // stage openings a full disk failed in a row

	mu      sync.Mutex
	stages  map[pipeline.PartitionID]*fileStage
	retired map[pipeline.PartitionID]bool
}

// fileStage is one tenancy's staging file and its split's published file.
type fileStage struct {
	mu     sync.Mutex
	closed bool
	split  spate.SplitID
	whole  bool // PublishWhole: the staging file is published by rename
	sealed bool // whole: the final commit's cut is fsynced and f closed
	// sealedAt is the watermark of the final commit (whole, sealed).
	sealedAt int64
	// listedStage (whole) is the earlier staging file the committed
	// record listed when the tenancy opened: kept until a won commit
	// lists this tenancy's own.
	listedStage string

	stageRel  string // relative to the destination, as committables name it
	stagePath string
	stageDir  string
	f         *os.File
	size      int64  // bytes staged
	pcrc      uint32 // CRC-32C of the staged bytes [0, size)
	synced    int64  // bytes of f known durable
	// marks maps records past the last prepared cut to where their bytes
	// end in the staging file, and the staging file's CRC there, in offset
	// order.
	marks []stageMark

	finalRel  string
	finalPath string
	out       *os.File // the published file, opened at the first publish
	finalLen  int64    // published bytes
	finalCRC  uint32   // CRC-32C of the published bytes

	// from..to is the prepared, unpublished range of the staging file;
	// rangeCRC its checksum, fromCRC and toCRC the staging file's CRC of
	// [0, from) and [0, to). Checksums are extended by combination
	// (crcCombine), so a commit never reads back what it staged, and the
	// publish copies the range inside the kernel (copy_file_range).
	from, to       int64
	rangeCRC       uint32
	fromCRC, toCRC uint32
}

type stageMark struct {
	off, end int64
	pcrc     uint32 // the staging file's CRC of [0, end)
}

// stagedCommit is the committable: what of the split's output a commit
// covers.
type stagedCommit struct {
	V     int    `json:"v"`
	File  string `json:"file"`
	Len   int64  `json:"len"`
	CRC   uint32 `json:"crc"`
	Stage string `json:"stage,omitempty"`
	From  int64  `json:"from,omitempty"`
	To    int64  `json:"to,omitempty"`
	RCRC  uint32 `json:"rcrc,omitempty"`
	// Whole (version 2, whole-file publishing): Stage's [0, To) is to be
	// renamed to File.
	Whole bool `json:"whole,omitempty"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	stagedMetaDir  = ".spate"
	stagedJobFile  = "job"
	stagedStageDir = "stage"
	stagedSuffix   = ".out"
	// stagedStageSuffix ends a tenancy's staging file, <epoch>.stage.
	stagedStageSuffix = ".stage"
)

// NewStagedFileSink writes the output of job to dir (created if absent).
// dir must hold no other job's output: its marker dir/.spate/job names the
// job that owns it, and a different job is refused. An empty job skips
// the marker.
func NewStagedFileSink(dir, job string) (*StagedFileSink, error) {
	stageRoot := filepath.Join(dir, stagedMetaDir, stagedStageDir)
	if err := mkdirDurable(stageRoot); err != nil {
		return nil, fmt.Errorf("file sink: cannot create the destination %s: %w (is it writable?)", dir, err)
	}
	if job != "" {
		if err := claimDestination(dir, job); err != nil {
			return nil, err
		}
	}
	return &StagedFileSink{dir: dir, Format: formatLine, stages: map[pipeline.PartitionID]*fileStage{}, retired: map[pipeline.PartitionID]bool{}}, nil
}

// claimDestination writes or checks the destination's job marker. The
// marker appears whole or not at all: it is written and fsynced under a
// name of its own, then hard-linked to its place, which fails if a marker
// is already there. (Creating the marker in place with O_EXCL and writing
// it after let a worker started at the same moment read it empty.) A
// marker already there (every worker but the first, every restart) is
// only read.
func claimDestination(dir, job string) error {
	path := filepath.Join(dir, stagedMetaDir, stagedJobFile)
	want := []byte(job + "\n")
	err := checkJobMarker(dir, path, want)
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := atomicfile.WriteNew(path, want); !errors.Is(err, fs.ErrExist) {
		if err != nil {
			return fmt.Errorf("file sink: cannot write the destination's job marker %s: %w (is %s writable?)", path, err, dir)
		}
		return nil
	}
	return checkJobMarker(dir, path, want) // another worker linked it first
}

// checkJobMarker checks the marker at path names the job want names; an
// absent marker is fs.ErrNotExist.
func checkJobMarker(dir, path string, want []byte) error {
	got, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return err
	case err != nil:
		return fmt.Errorf("file sink: cannot read the destination's job marker %s: %w", path, err)
	case !bytes.Equal(got, want):
		return fmt.Errorf("file sink: the destination %s holds the output of job %q (its marker %s), not of job %q: give each job its own destination, or delete that job's output first",
			dir, string(bytes.TrimSpace(got)), path, bytes.TrimSpace(want))
	}
	return nil
}

// Path is the published file of split.
func (s *StagedFileSink) Path(split spate.SplitID) string {
	return filepath.Join(s.dir, split.String()+stagedSuffix)
}

// Destination implements [pipeline.SinkDestination].
func (s *StagedFileSink) Destination() string { return s.dir }

// OpenStage implements [pipeline.StagingSink]: it checks the split's published file
// against the committed output, finishes the publish the record lists,
// discards every other staged file of the split and opens a staging file
// for the tenancy.
func (s *StagedFileSink) OpenStage(ctx context.Context, t pipeline.StageTenancy, committed []byte) (err error) {
	defer func() { err = markFileFault(err) }() // filefault.go
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.classifyStageError(s.openStage(t, committed))
}

func (s *StagedFileSink) openStage(t pipeline.StageTenancy, committed []byte) error {
	fs := &fileStage{
		whole:     s.PublishWhole,
		split:     t.Split,
		finalRel:  t.Split.String() + stagedSuffix,
		finalPath: s.Path(t.Split),
		stageDir:  filepath.Join(s.dir, stagedMetaDir, stagedStageDir, t.Split.String()),
	}
	fs.stageRel = filepath.ToSlash(filepath.Join(stagedMetaDir, stagedStageDir, t.Split.String(), strconv.FormatUint(uint64(t.Epoch), 10)+stagedStageSuffix))
	fs.stagePath = filepath.Join(s.dir, filepath.FromSlash(fs.stageRel))
	if fs.whole {
		return s.openStageWhole(t, fs, committed)
	}
	if c, err := decodeStagedCommit(committed); committed != nil && err == nil && c.V == stagedCommitWhole {
		return fmt.Errorf("the committed output of split %s was staged by a file sink that publishes whole files (PublishWhole; spate backfill --publish=complete): resume the job with that setting", t.Split)
	}
	if err := s.recover(fs, committed); err != nil {
		return err
	}
	if err := mkdirDurable(fs.stageDir); err != nil {
		return fmt.Errorf("cannot create the staging directory %s: %w", fs.stageDir, err)
	}
	// Discard what the committed record does not list: the staging files
	// of earlier tenancies (their listed ranges are published now).
	if err := discardEarlierStages(fs.stageDir, t.Epoch, ""); err != nil {
		return err
	}
	f, err := os.OpenFile(fs.stagePath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("cannot create the staging file %s: %w", fs.stagePath, err)
	}
	if err := syncDir(fs.stageDir); err != nil {
		_ = f.Close()
		return fmt.Errorf("cannot make the staging file %s durable: %w", fs.stagePath, err)
	}
	fs.f = f
	s.register(t.Partition, fs)
	return nil
}

// openStageWhole is OpenStage of whole-file publishing.
func (s *StagedFileSink) openStageWhole(t pipeline.StageTenancy, fs *fileStage, committed []byte) error {
	src, err := s.recoverWhole(fs, committed)
	if err != nil {
		return err
	}
	if err := mkdirDurable(fs.stageDir); err != nil {
		return fmt.Errorf("cannot create the staging directory %s: %w", fs.stageDir, err)
	}
	if err := s.openWhole(fs, t.Epoch, src); err != nil {
		return err
	}
	s.register(t.Partition, fs)
	return nil
}

func (s *StagedFileSink) register(p pipeline.PartitionID, fs *fileStage) {
	s.mu.Lock()
	s.stages[p] = fs
	delete(s.retired, p)
	s.mu.Unlock()
}

// discardEarlierStages removes the staging files in stageDir of the
// split's tenancies before epoch, but keep (a path; "" keeps none), and
// anything there that is no tenancy's staging file.
//
// A staging file of a later tenancy is never touched: this tenancy is
// then a zombie (its process froze between gaining the split and opening
// its stage, and a newer owner took the split over meanwhile), and the
// newer owner's commits list that file. Epochs only grow, so the newer
// owner's own stage removes the zombie's file in turn, and the split's
// completion removes whatever a zombie left.
func discardEarlierStages(stageDir string, epoch spate.LeaseEpoch, keep string) error {
	entries, err := os.ReadDir(stageDir)
	if err != nil {
		return fmt.Errorf("cannot list the staging directory %s: %w", stageDir, err)
	}
	for _, e := range entries {
		p := filepath.Join(stageDir, e.Name())
		if p == keep {
			continue
		}
		if n, ok := strings.CutSuffix(e.Name(), stagedStageSuffix); ok && !e.IsDir() {
			if other, err := strconv.ParseUint(n, 10, 64); err == nil && spate.LeaseEpoch(other) >= epoch {
				continue // this tenancy's own, or a newer owner's
			}
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("cannot discard the unlisted staging file %s: %w", p, err)
		}
	}
	return nil
}

// recover brings the split's published file to the committed output:
// it verifies the published prefix and publishes the listed range.
func (s *StagedFileSink) recover(fs *fileStage, committed []byte) error {
	size, err := fileSize(fs.finalPath)
	if err != nil {
		return fmt.Errorf("cannot read the published file %s: %w", fs.finalPath, err)
	}
	if committed == nil {
		if size > 0 {
			return fmt.Errorf("%s already holds %d bytes, but split %s has no committed output: another job, or an earlier run into the same destination, wrote it; point the job at an empty destination or move the file away",
				fs.finalPath, size, fs.split)
		}
		return nil
	}
	c, err := decodeStagedCommit(committed)
	if err != nil {
		return fmt.Errorf("the committed output of split %s is not this sink's: %w", fs.split, err)
	}
	if c.File != fs.finalRel {
		return fmt.Errorf("the committed output of split %s names %q, not %q: the record was written by another sink", fs.split, c.File, fs.finalRel)
	}
	if size < c.Len {
		return fmt.Errorf("%s holds %d bytes but %d are committed: it was truncated or deleted under the job; restore it, or delete the job and its output and run again", fs.finalPath, size, c.Len)
	}
	crc, err := crcOf(fs.finalPath, 0, c.Len)
	if err != nil {
		return fmt.Errorf("cannot read the published file %s: %w", fs.finalPath, err)
	}
	if crc != c.CRC {
		return fmt.Errorf("%s was altered under the job: its first %d bytes no longer match the committed checksum; restore it, or delete the job and its output and run again", fs.finalPath, c.Len)
	}
	fs.finalLen, fs.finalCRC = c.Len, c.CRC
	n := c.To - c.From
	if n <= 0 {
		if size > c.Len {
			return pastCommitted(fs.finalPath, size-c.Len, c.Len)
		}
		return nil
	}
	if size > c.Len+n {
		return pastCommitted(fs.finalPath, size-c.Len-n, c.Len+n)
	}
	stagePath := filepath.Join(s.dir, filepath.FromSlash(c.Stage))
	data, rerr := readRange(stagePath, c.From, c.To)
	if rerr == nil && crc32.Checksum(data, castagnoli) != c.RCRC {
		rerr = fmt.Errorf("its bytes %d..%d no longer match the committed checksum", c.From, c.To)
	}
	if rerr != nil {
		// Published already? (The previous owner's publish landed before
		// its staging file went.)
		if size == c.Len+n {
			if got, err := readRange(fs.finalPath, c.Len, c.Len+n); err == nil && crc32.Checksum(got, castagnoli) == c.RCRC {
				fs.finalLen, fs.finalCRC = c.Len+n, crc32.Update(c.CRC, castagnoli, got)
				return nil
			}
		}
		return fmt.Errorf("the staging file %s that split %s's committed record lists is damaged (%v) and %s lacks its bytes: the committed output cannot be completed; delete the job and its output and run again",
			stagePath, fs.split, rerr, fs.finalPath)
	}
	if err := fs.publishBytes(c.Len, data); err != nil {
		return err
	}
	fs.finalLen, fs.finalCRC = c.Len+n, crc32.Update(c.CRC, castagnoli, data)
	return nil
}

// pastCommitted is the error of a published file that holds extra bytes
// past the committed length. They may be committed output the store no
// longer lists (a store restored from a backup or rolled back holds older
// records than the output), so the fix never removes them.
func pastCommitted(path string, extra, committed int64) error {
	return fmt.Errorf("%s holds %d bytes past the %d its split's committed record lists: either the store lost commits "+
		"(restored from a backup or rolled back: its records are older than the output) or something other than this job wrote them; "+
		"nothing was changed, and the file may hold committed output: do not delete it. If the store lost commits, run against the store "+
		"that holds the job's latest state; otherwise, to start over, delete the job and give it an empty destination",
		path, extra, committed)
}

// publishBytes writes data to the published file at off and fsyncs it.
func (fs *fileStage) publishBytes(off int64, data []byte) error {
	return fs.publish(off, int64(len(data)), func() error {
		_, err := fs.out.WriteAt(data, off)
		return err
	})
}

// publishRange copies the staging file's [from, from+n) to the published
// file at off, inside the kernel, and fsyncs it.
func (fs *fileStage) publishRange(off, from, n int64) error {
	return fs.publish(off, n, func() error { return copyRange(fs.out, off, fs.f, from, n) })
}

// publish checks the published file, writes n bytes at off with write and
// fsyncs it.
func (fs *fileStage) publish(off, n int64, write func() error) error {
	if fs.out == nil {
		f, err := os.OpenFile(fs.finalPath, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("cannot open the published file %s: %w", fs.finalPath, err)
		}
		if err := syncDir(filepath.Dir(fs.finalPath)); err != nil {
			_ = f.Close()
			return fmt.Errorf("cannot make the published file %s durable: %w", fs.finalPath, err)
		}
		fs.out = f
	}
	// The file must still be the one this tenancy opened, at the length
	// the commit fixed (or partly past it: an interrupted publish).
	st, err := os.Stat(fs.finalPath)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: the published file %s is gone (%v): it was deleted under the job; restore it, or delete the job and its output and run again", pipeline.ErrOutputDamaged, fs.finalPath, err)
	}
	if err != nil {
		return fmt.Errorf("cannot read the published file %s: %w", fs.finalPath, err)
	}
	if ost, err := fs.out.Stat(); err != nil || !os.SameFile(st, ost) {
		return fmt.Errorf("%w: the published file %s was replaced under the job; restore it, or delete the job and its output and run again", pipeline.ErrOutputDamaged, fs.finalPath)
	}
	if st.Size() < off {
		return fmt.Errorf("%w: %s holds %d bytes but %d are committed: it was truncated under the job; restore it, or delete the job and its output and run again", pipeline.ErrOutputDamaged, fs.finalPath, st.Size(), off)
	}
	if st.Size() > off+n {
		return fmt.Errorf("%w: %w", pipeline.ErrOutputDamaged, pastCommitted(fs.finalPath, st.Size()-off-n, off+n))
	}
	// No torn line is ever visible under the final name: a full disk
	// fails the reservation before a byte is written, and a write that
	// fails halfway anyway is undone (the file is cut back to the length
	// the commits fixed; the retry writes the whole range again).
	if err := reserve(fs.out, off, n); err != nil {
		return fmt.Errorf("cannot publish to %s: %w", fs.finalPath, err)
	}
	if err := filehook.PublishWrite(fs.out, off, n, write); err != nil {
		if ost, serr := fs.out.Stat(); serr == nil && ost.Size() > off && ost.Size() <= off+n {
			if terr := fs.out.Truncate(off); terr == nil {
				_ = fs.out.Sync()
			} else {
				err = fmt.Errorf("%w; and the part written could not be undone: %v", err, terr)
			}
		}
		return fmt.Errorf("cannot publish to %s: %w", fs.finalPath, err)
	}
	if err := fs.out.Sync(); err != nil {
		return fmt.Errorf("cannot make %s durable: %w", fs.finalPath, err)
	}
	return nil
}

func (s *StagedFileSink) stage(p pipeline.PartitionID) (*fileStage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stages[p], s.retired[p]
}

// Write implements [pipeline.Sink]: it stages the records.
func (s *StagedFileSink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

// WriteChunks implements [pipeline.ChunkedSink]: each run of one partition's
// records is appended to its tenancy's staging file. Records of a
// partition whose tenancy ended are dropped: they are never committed
// under it.
func (s *StagedFileSink) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, records := range chunks {
		for i := 0; i < len(records); {
			j := i + 1
			for j < len(records) && records[j].Partition == records[i].Partition {
				j++
			}
			if err := s.writeRun(records[i].Partition, records[i:j]); err != nil {
				return err
			}
			i = j
		}
	}
	return nil
}

func (s *StagedFileSink) writeRun(p pipeline.PartitionID, records []pipeline.Record) error {
	fs, retired := s.stage(p)
	if fs == nil {
		if retired {
			return nil
		}
		return fmt.Errorf("file sink: partition %d: %w (%w)", p, pipeline.ErrNoStage, spate.ErrFatal)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed || fs.sealed {
		return nil // never committed under this tenancy
	}
	if n := len(fs.marks); n > 0 && records[0].Offset < fs.marks[n-1].off {
		return fmt.Errorf("file sink: split %s: record offset %d after %d: a staging sink needs a split's records in offset order (%w)",
			fs.split, records[0].Offset, fs.marks[n-1].off, spate.ErrFatal)
	}
	pb := fileBufs.Get().(*[]byte)
	buf := (*pb)[:0]
	defer func() {
		if cap(buf) <= 2*fileWriteChunk {
			*pb = buf[:0]
			fileBufs.Put(pb)
		}
	}()
	base, marks, pcrc := fs.size, len(fs.marks), fs.pcrc
	written := int64(0)
	var err error
	for i := range records {
		if i > 0 && records[i].Offset < records[i-1].Offset {
			err = fmt.Errorf("record offset %d after %d: a staging sink needs a split's records in offset order (%w)", records[i].Offset, records[i-1].Offset, spate.ErrFatal)
			break
		}
		at := len(buf)
		buf = s.Format(buf, records[i])
		pcrc = crc32.Update(pcrc, castagnoli, buf[at:])
		fs.marks = append(fs.marks, stageMark{off: records[i].Offset, end: base + written + int64(len(buf)), pcrc: pcrc})
		if len(buf) >= fileWriteChunk {
			n, werr := fs.f.WriteAt(buf, base+written)
			written += int64(n)
			buf = buf[:0]
			if werr != nil {
				err = werr
				break
			}
		}
	}
	if err == nil && len(buf) > 0 {
		n, werr := fs.f.WriteAt(buf, base+written)
		written += int64(n)
		err = werr
	}
	if err != nil {
		fs.marks = fs.marks[:marks]
		if written > 0 {
			if terr := fs.f.Truncate(base); terr != nil {
				return fmt.Errorf("file sink: stage split %s in %s: %w (rollback failed: %v)", fs.split, fs.stagePath, err, terr)
			}
		}
		return fmt.Errorf("file sink: stage split %s in %s: %w", fs.split, fs.stagePath, err)
	}
	fs.size, fs.pcrc = base+written, pcrc
	return nil
}

// Prepare implements [pipeline.StagingSink]: it fsyncs the staging file and lists
// the staged range of the records below watermark. It always covers the
// watermark (final makes no difference): a published file grows by
// every commit.
func (s *StagedFileSink) Prepare(ctx context.Context, p pipeline.PartitionID, watermark int64, final bool) ([]byte, int64, bool, error) {
	out, pending, err := s.prepare(ctx, p, watermark, final)
	return out, watermark, pending, err
}

func (s *StagedFileSink) prepare(ctx context.Context, p pipeline.PartitionID, watermark int64, final bool) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	fs, _ := s.stage(p)
	if fs == nil {
		return nil, false, fmt.Errorf("file sink: partition %d has no open stage", p)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	cut, cutCRC := fs.to, fs.toCRC
	i, _ := slices.BinarySearchFunc(fs.marks, watermark, func(m stageMark, w int64) int {
		if m.off < w {
			return -1
		}
		return 1
	})
	if i > 0 && fs.marks[i-1].end > cut {
		cut, cutCRC = fs.marks[i-1].end, fs.marks[i-1].pcrc
	}
	if fs.whole {
		return fs.prepareWhole(i, watermark, cut, cutCRC, final)
	}
	if cut > fs.synced {
		size := fs.size
		if err := fs.f.Sync(); err != nil {
			return nil, false, fmt.Errorf("file sink: cannot make the staging file %s durable: %w", fs.stagePath, err)
		}
		fs.synced = size
	}
	if cut > fs.to {
		fs.to, fs.toCRC = cut, cutCRC
		fs.rangeCRC = crcRange(fs.fromCRC, fs.toCRC, fs.from, fs.to)
	}
	fs.marks = fs.marks[:copy(fs.marks, fs.marks[i:])]
	return fs.committable(), fs.to > fs.from, nil
}

func (fs *fileStage) committable() []byte {
	c := stagedCommit{V: 1, File: fs.finalRel, Len: fs.finalLen, CRC: fs.finalCRC}
	if fs.to > fs.from {
		c.Stage, c.From, c.To, c.RCRC = fs.stageRel, fs.from, fs.to, fs.rangeCRC
	}
	b, _ := json.Marshal(c)
	return b
}

// Publish implements [pipeline.StagingSink]: it copies the listed range to the
// published file at the committed length and fsyncs it.
func (s *StagedFileSink) Publish(ctx context.Context, p pipeline.PartitionID, committable []byte) (err error) {
	defer func() { err = markFileFault(err) }() // filefault.go
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := decodeStagedCommit(committable)
	if err != nil {
		return err
	}
	fs, _ := s.stage(p)
	if fs == nil {
		return fmt.Errorf("file sink: partition %d has no open stage", p)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.whole {
		return fs.publishWholeListed(c)
	}
	n := c.To - c.From
	if n <= 0 || c.Len+n <= fs.finalLen {
		return nil // nothing listed, or published already
	}
	if c.Len != fs.finalLen || c.Stage != fs.stageRel {
		return fmt.Errorf("file sink: split %s: the committable lists %s[%d:%d) at %d, but %d bytes are published: not this tenancy's", fs.split, c.Stage, c.From, c.To, c.Len, fs.finalLen)
	}
	if c.From != fs.from || c.To > fs.to {
		return fmt.Errorf("file sink: split %s: the committable lists %s[%d:%d), but %d..%d is prepared: not this tenancy's", fs.split, c.Stage, c.From, c.To, fs.from, fs.to)
	}
	if c.To == fs.to && c.RCRC != fs.rangeCRC {
		return fmt.Errorf("file sink: split %s: the committable's checksum does not match the range prepared for it: not this tenancy's", fs.split)
	}
	if err := fs.publishRange(c.Len, c.From, n); err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	fs.finalLen, fs.finalCRC = c.Len+n, crcCombine(c.CRC, c.RCRC, n)
	fs.from, fs.fromCRC = c.To, crcCombine(fs.fromCRC, c.RCRC, n)
	fs.rangeCRC = crcRange(fs.fromCRC, fs.toCRC, fs.from, fs.to)
	return nil
}

// CloseStage implements [pipeline.StagingSink]. A completed split's staging
// directory is removed.
func (s *StagedFileSink) CloseStage(p pipeline.PartitionID, completed bool) {
	s.mu.Lock()
	fs := s.stages[p]
	delete(s.stages, p)
	s.retired[p] = true
	s.mu.Unlock()
	if fs == nil {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.close()
	if completed {
		_ = os.RemoveAll(fs.stageDir)
	}
}

func (fs *fileStage) close() {
	fs.closed = true
	if fs.f != nil {
		_ = fs.f.Close()
		fs.f = nil
	}
	if fs.out != nil {
		_ = fs.out.Close()
		fs.out = nil
	}
}

// Close closes every open file; staged output stays for the next owner.
func (s *StagedFileSink) Close() error {
	s.mu.Lock()
	stages := s.stages
	s.stages = map[pipeline.PartitionID]*fileStage{}
	s.mu.Unlock()
	for _, fs := range stages {
		fs.mu.Lock()
		fs.close()
		fs.mu.Unlock()
	}
	return nil
}

// RemoveStaging removes what is left under dir/.spate/stage once a job
// completed: staging files nobody lists (a zombie's, written after its
// last commit). Call it only after the job completed.
func RemoveStaging(dir string) error {
	root := filepath.Join(dir, stagedMetaDir, stagedStageDir)
	entries, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var first error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func decodeStagedCommit(b []byte) (stagedCommit, error) {
	var c stagedCommit
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("file sink: committable %.64q: %w", b, err)
	}
	switch {
	case c.V == 1 && (c.File == "" || c.Len < 0 || c.From < 0 || c.To < c.From || (c.To > c.From && c.Stage == "") || c.Whole),
		c.V == stagedCommitWhole && (c.File == "" || c.Stage == "" || c.Len < 0 || c.From != 0 || c.To < c.Len),
		c.V != 1 && c.V != stagedCommitWhole:
		return c, fmt.Errorf("file sink: committable %.64q is not a version-1 or version-2 file committable", b)
	}
	if !filepath.IsLocal(filepath.FromSlash(c.File)) || (c.Stage != "" && !filepath.IsLocal(filepath.FromSlash(c.Stage))) {
		return c, fmt.Errorf("file sink: committable %.64q names a file outside the destination", b)
	}
	return c, nil
}

func fileSize(path string) (int64, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func readRange(path string, from, to int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRangeFile(f, from, to)
}

func readRangeFile(f *os.File, from, to int64) ([]byte, error) {
	data := make([]byte, to-from)
	n, err := f.ReadAt(data, from)
	if err == io.EOF && int64(n) == to-from {
		err = nil
	}
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("it holds %d bytes, fewer than %d", from+int64(n), to)
		}
		return nil, err
	}
	return data, nil
}

// crcOf is the CRC-32C of path[from:to), read in pieces.
func crcOf(path string, from, to int64) (uint32, error) {
	if to <= from {
		return 0, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var crc uint32
	for off := from; off < to; {
		n := min(int64(len(buf)), to-off)
		m, err := f.ReadAt(buf[:n], off)
		crc = crc32.Update(crc, castagnoli, buf[:m])
		off += int64(m)
		if err != nil && !(err == io.EOF && off == to) {
			if err == io.EOF {
				return 0, fmt.Errorf("it ends at %d, before %d", off, to)
			}
			return 0, err
		}
	}
	return crc, nil
}

// mkdirDurable is os.MkdirAll whose new directories survive a power
// loss: each one created is fsynced into its parent, from the top down. A
// committed record names a staging file by its path; a directory on that
// path that a crash could take away would lose a committed range.
func mkdirDurable(dir string) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR} // Fatal, with the fix (filefault.go)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := syncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs a directory, making the entries created in it durable
// (a variable so that a test can see which directories were synced).
var syncDir = func(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyRangeRW copies src[from, from+n) to dst at off through a buffer.
func copyRangeRW(dst *os.File, off int64, src *os.File, from, n int64) error {
	buf := make([]byte, min(n, fileWriteChunk))
	for n > 0 {
		k, err := src.ReadAt(buf[:min(n, int64(len(buf)))], from)
		if k > 0 {
			if _, werr := dst.WriteAt(buf[:k], off); werr != nil {
				return werr
			}
			from, off, n = from+int64(k), off+int64(k), n-int64(k)
		}
		if err != nil && n > 0 {
			if errors.Is(err, io.EOF) {
				return errors.New("the staging file is shorter than its committed range")
			}
			return err
		}
	}
	return nil
}
