package filesink

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Whole-file publishing ([StagedFileSink.PublishWhole]): a tenancy's
// staging file holds its split's whole output from byte 0 and becomes the
// published file by rename, so each byte is written once.
//
// A tenancy stages into DIR/.spate/stage/<split>/<epoch>.stage as in the
// default mode, but at the split's offsets: the file starts with what the
// split committed before the tenancy (copied there when the tenancy
// opens: a takeover or a hand-back rewrites the committed prefix once).
// Each commit fsyncs the staging file and lists it with the length and
// CRC-32C of its committed prefix; nothing is published. The final commit
// (the split's completion, or a hand-back) first cuts the staging file to
// the committed length, fsyncs it and closes the tenancy's descriptor, then
// lists it for publishing; once that commit won, the staging file is
// renamed to DIR/<split>.out and the directory fsynced.
//
// Zombie-safe: a tenancy writes its staging file only past the bytes its
// commits list, and the only file ever renamed to a published name is one
// its tenancy had closed before the commit that lists it. A new owner
// renames what the committed record lists (if the old owner had not),
// copies the committed prefix into a staging file of its own and deletes
// the staging files of the split's earlier tenancies (a zombie's writes
// then reach an unlinked file; its commits are fenced). It never touches a
// later tenancy's: a stage that opens late is a zombie's, and the newer
// owner's commits list that file.
//
// The published file appears whole when its split completes (or is handed
// back: then it is replaced, by rename, by a longer one when the split
// completes), not a commit interval after its lines were acknowledged: a
// mode for bounded jobs (a split of a followed file that never completes
// would never publish).

// stagedCommitWhole is the version of a committable of whole-file
// publishing: File holds Len bytes (CRC), Stage holds the split's
// committed output [0, To) (RCRC), and Whole asks for Stage to be renamed
// to File.
const stagedCommitWhole = 2

// wholeSource is where a tenancy finds the committed output it starts
// from.
type wholeSource struct {
	path string
	n    int64
	crc  uint32
}

// recoverWhole brings the published file to the committed record of a
// split (finishing a rename it lists) and returns where the committed
// output [0, n) is to be copied from.
func (s *StagedFileSink) recoverWhole(fs *fileStage, committed []byte) (wholeSource, error) {
	if committed == nil {
		return wholeSource{}, s.recover(fs, nil)
	}
	c, err := decodeStagedCommit(committed)
	if err != nil {
		return wholeSource{}, fmt.Errorf("the committed output of split %s is not this sink's: %w", fs.split, err)
	}
	if c.V != stagedCommitWhole {
		// Written in the default mode: finish its publish; the published
		// file holds the committed output.
		if err := s.recover(fs, committed); err != nil {
			return wholeSource{}, err
		}
		if fs.out != nil {
			_ = fs.out.Close() // never written again: the next publish renames
			fs.out = nil
		}
		return wholeSource{path: fs.finalPath, n: fs.finalLen, crc: fs.finalCRC}, nil
	}
	if c.File != fs.finalRel {
		return wholeSource{}, fmt.Errorf("the committed output of split %s names %q, not %q: the record was written by another sink", fs.split, c.File, fs.finalRel)
	}
	stagePath := filepath.Join(s.dir, filepath.FromSlash(c.Stage))
	if c.Whole {
		if err := publishWhole(fs, c, stagePath); err != nil {
			return wholeSource{}, err
		}
		return wholeSource{path: fs.finalPath, n: c.To, crc: c.RCRC}, nil
	}
	if err := checkPublished(fs.finalPath, c.Len, c.CRC); err != nil {
		return wholeSource{}, err
	}
	fs.finalLen, fs.finalCRC = c.Len, c.CRC
	crc, err := crcOf(stagePath, 0, c.To)
	if err == nil && crc != c.RCRC {
		err = fmt.Errorf("its first %d bytes no longer match the committed checksum", c.To)
	}
	if err != nil {
		return wholeSource{}, fmt.Errorf("the staging file %s that split %s's committed record lists is damaged (%v): the committed output cannot be completed; delete the job and its output and run again",
			stagePath, fs.split, err)
	}
	return wholeSource{path: stagePath, n: c.To, crc: c.RCRC}, nil
}

// checkPublished checks that the published file at path holds exactly
// the n committed bytes with checksum crc (absent when n is 0).
func checkPublished(path string, n int64, crc uint32) error {
	size, err := fileSize(path)
	if err != nil {
		return fmt.Errorf("cannot read the published file %s: %w", path, err)
	}
	switch {
	case size < n:
		return fmt.Errorf("%w: %s holds %d bytes but %d are committed: it was truncated or deleted under the job; restore it, or delete the job and its output and run again", pipeline.ErrOutputDamaged, path, size, n)
	case size > n:
		return fmt.Errorf("%w: %w", pipeline.ErrOutputDamaged, pastCommitted(path, size-n, n))
	case n == 0:
		return nil
	}
	got, err := crcOf(path, 0, n)
	if err != nil {
		return fmt.Errorf("cannot read the published file %s: %w", path, err)
	}
	if got != crc {
		return fmt.Errorf("%w: %s was altered under the job: its %d bytes no longer match the committed checksum; restore it, or delete the job and its output and run again", pipeline.ErrOutputDamaged, path, n)
	}
	return nil
}

// publishWhole renames the staging file c lists to the published file,
// idempotently: a publish that already happened (the staging file gone,
// the published file holding exactly what c lists) is done.
func publishWhole(fs *fileStage, c stagedCommit, stagePath string) error {
	_, serr := os.Stat(stagePath)
	if errors.Is(serr, os.ErrNotExist) {
		if err := checkPublished(fs.finalPath, c.To, c.RCRC); err != nil {
			return fmt.Errorf("the staging file %s that split %s's committed record lists is gone, and the published file does not hold its bytes (%w): the committed output cannot be completed; delete the job and its output and run again",
				stagePath, fs.split, err)
		}
		fs.finalLen, fs.finalCRC = c.To, c.RCRC
		return nil
	}
	if err := checkPublished(fs.finalPath, c.Len, c.CRC); err != nil {
		return err
	}
	crc, err := crcOf(stagePath, 0, c.To)
	if err == nil && crc != c.RCRC {
		err = fmt.Errorf("its first %d bytes no longer match the committed checksum", c.To)
	}
	if err == nil {
		if size, _ := fileSize(stagePath); size != c.To {
			err = fmt.Errorf("it holds %d bytes, not the %d committed", size, c.To)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: the staging file %s that split %s's committed record lists is damaged (%v): the committed output cannot be published; delete the job and its output and run again",
			pipeline.ErrOutputDamaged, stagePath, fs.split, err)
	}
	if err := os.Rename(stagePath, fs.finalPath); err != nil {
		return fmt.Errorf("cannot publish %s as %s: %w", stagePath, fs.finalPath, err)
	}
	if err := syncDir(filepath.Dir(fs.finalPath)); err != nil {
		return fmt.Errorf("cannot make the published file %s durable: %w", fs.finalPath, err)
	}
	fs.finalLen, fs.finalCRC = c.To, c.RCRC
	return nil
}

// openWhole creates the tenancy's staging file holding the committed
// output src lists, and discards the staging files of the split's earlier
// tenancies but src (see discardEarlierStages: a newer owner's are never
// touched): that one stays listed by the committed record until a commit
// of this tenancy lists its own file (an owner that dies before that
// leaves the next one the same source), and goes at this tenancy's
// first publish.
func (s *StagedFileSink) openWhole(fs *fileStage, epoch spate.LeaseEpoch, src wholeSource) error {
	f, err := os.OpenFile(fs.stagePath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("cannot create the staging file %s: %w", fs.stagePath, err)
	}
	if src.n > 0 {
		err := copyPrefix(f, src)
		if err != nil {
			_ = f.Close()
			_ = os.Remove(fs.stagePath)
			return fmt.Errorf("cannot copy the committed output of split %s from %s to %s: %w", fs.split, src.path, fs.stagePath, err)
		}
	}
	if err := syncDir(fs.stageDir); err != nil {
		_ = f.Close()
		return fmt.Errorf("cannot make the staging file %s durable: %w", fs.stagePath, err)
	}
	if err := discardEarlierStages(fs.stageDir, epoch, src.path); err != nil {
		_ = f.Close()
		return err
	}
	fs.f = f
	if src.path != fs.finalPath {
		fs.listedStage = src.path
	}
	fs.size, fs.pcrc = src.n, src.crc
	fs.to, fs.toCRC = src.n, src.crc
	return nil
}

// copyPrefix copies src's committed bytes to the start of f.
func copyPrefix(f *os.File, src wholeSource) error {
	in, err := os.Open(src.path)
	if err != nil {
		return err
	}
	defer in.Close()
	return copyRange(f, 0, in, 0, src.n)
}

// prepareWhole is Prepare of whole-file publishing, with fs locked: cut is
// the committed length (cutCRC its checksum), and the marks before i are
// the records it covers. On an error nothing changed but what a retry
// does again.
func (fs *fileStage) prepareWhole(i int, watermark, cut int64, cutCRC uint32, final bool) ([]byte, bool, error) {
	if fs.sealed {
		if watermark > fs.sealedAt || cut > fs.to {
			// The records past the final commit were dropped: no commit of
			// this tenancy may cover them.
			return nil, false, fmt.Errorf("file sink: split %s: a commit at offset %d past its final commit at %d: its staging file %s is sealed", fs.split, watermark, fs.sealedAt, fs.stagePath)
		}
		return fs.committableWhole(), fs.to > fs.finalLen, nil
	}
	if final && fs.size > cut {
		// Bytes past the final commit are never listed by this tenancy:
		// cut them, so the file is exactly the committed output.
		if err := fs.f.Truncate(cut); err != nil {
			return nil, false, fmt.Errorf("file sink: cannot cut the staging file %s to its committed %d bytes: %w", fs.stagePath, cut, err)
		}
		// The records past the cut are gone from the file: their marks go
		// with them (they are never committed by this tenancy).
		fs.size, fs.pcrc, fs.marks = cut, cutCRC, fs.marks[:i]
		// The fsync below makes the new length durable too (a staging
		// file that came back from a crash longer than listed would be
		// taken for damage), on a retry as well.
		fs.synced = -1
	}
	if cut > fs.synced {
		size := fs.size
		if err := fs.f.Sync(); err != nil {
			return nil, false, fmt.Errorf("file sink: cannot make the staging file %s durable: %w", fs.stagePath, err)
		}
		fs.synced = size
	}
	fs.to, fs.toCRC = cut, cutCRC
	fs.marks = fs.marks[:copy(fs.marks, fs.marks[i:])]
	if final {
		// Closed before the commit that lists it for publishing: no
		// descriptor of this tenancy reaches the file that is renamed.
		// (Its bytes are durable already: a failed close loses nothing.)
		_ = fs.f.Close()
		fs.f, fs.sealed, fs.sealedAt = nil, true, watermark
	}
	return fs.committableWhole(), fs.sealed && fs.to > fs.finalLen, nil
}

func (fs *fileStage) committableWhole() []byte {
	c := stagedCommit{V: stagedCommitWhole, File: fs.finalRel, Len: fs.finalLen, CRC: fs.finalCRC, Stage: fs.stageRel, To: fs.to, RCRC: fs.toCRC}
	c.Whole = fs.sealed && fs.to > fs.finalLen
	b, _ := json.Marshal(c)
	return b
}

// publishWholeListed is Publish of whole-file publishing, with fs locked.
func (fs *fileStage) publishWholeListed(c stagedCommit) error {
	if fs.listedStage != "" && c.Stage == fs.stageRel {
		// A won commit lists this tenancy's file: the one the record
		// listed before is nobody's source any more.
		if err := os.Remove(fs.listedStage); err == nil || errors.Is(err, os.ErrNotExist) {
			fs.listedStage = ""
		}
	}
	if !c.Whole || fs.finalLen >= c.To {
		return nil // nothing listed, or published already
	}
	if c.Stage != fs.stageRel || c.To != fs.to || c.RCRC != fs.toCRC || !fs.sealed || c.Len != fs.finalLen {
		return fmt.Errorf("file sink: split %s: the committable lists %s[0:%d) over %d published bytes, but %d..%d is prepared: not this tenancy's", fs.split, c.Stage, c.To, c.Len, fs.finalLen, fs.to)
	}
	if err := publishWhole(fs, c, fs.stagePath); err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	return nil
}

// Transient faults of a local file system: they pass without anyone
// mending anything, so a stage that failed with one is tried again
// (marked [spate.ErrRetryable]). A full disk (ENOSPC, EDQUOT) is not
// among them: it passes only when someone frees space, so it is retried a
// bounded number of times (noSpaceStageRetries) and then reported as the
// error it is, naming the file.
var transientErrnos = []syscall.Errno{syscall.EINTR, syscall.EAGAIN, syscall.EBUSY, syscall.ETIMEDOUT, syscall.ESTALE, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM}

// noSpaceStageRetries bounds the stage openings of one sink in a row that
// a full disk fails and that are tried again (marked Retryable, so they
// cost the split no attempt): about 3 s of the coordination driver's
// backoff for space to come back (a log rotated, another job's staging
// removed).
// Past it the error is reported unmarked, and the split is set aside with
// it as the reason.
const noSpaceStageRetries = 5

// classifyStageError marks an error of OpenStage Retryable when it is a
// transient fault of the file system (see transientErrnos), or one of
// the first noSpaceStageRetries full disks in a row.
func (s *StagedFileSink) classifyStageError(err error) error {
	if err == nil {
		s.noSpace.Store(0)
		return nil
	}
	if errors.Is(err, pipeline.ErrOutputDamaged) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		if s.noSpace.Add(1) <= noSpaceStageRetries {
			return retryableFS{err}
		}
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && slices.Contains(transientErrnos, errno) {
		return retryableFS{err}
	}
	return err
}

// retryableFS is a file-system error marked [spate.ErrRetryable], its
// message unchanged.
type retryableFS struct{ err error }

func (e retryableFS) Error() string   { return e.err.Error() }
func (e retryableFS) Unwrap() []error { return []error{e.err, spate.ErrRetryable} }
