package filesink

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// The staged file sink marks its faults, as the bucket sink does
// (blobsink/fault.go), so that the coordination driver can tell a fault
// that passes from one that no retry mends:
//
//   - Retryable: the disk is full or over its quota, an I/O error, a
//     resource that is short for a moment (ENOSPC, EDQUOT, EIO, EAGAIN,
//     EINTR, EBUSY, ETIMEDOUT, ESTALE, ENFILE, EMFILE, ENOMEM). A stage
//     that cannot open for one keeps its split held and is tried again,
//     backing off, without spending an attempt; a publish is retried.
//   - Fatal, with the fix in the message: permission denied, a read-only
//     filesystem, a path component that is not a directory (or a
//     directory where a file belongs), a name too long, a loop of links
//     (EACCES, EPERM, EROFS, ENOTDIR, EISDIR, ENAMETOOLONG, ELOOP). The
//     split is set aside (failed through the coordinator with the error,
//     which names the path, as the reason; past its attempts it is
//     quarantined) and the rest of the job goes on.
//
// An error already marked (Retryable, Fatal, ErrOutputDamaged) keeps its
// mark; one of none of these kinds is left unmarked.

// fileFault is an error of the file sink marked with its kind; for a
// fatal one its text carries what to fix.
type fileFault struct {
	err  error
	kind error // spate.ErrRetryable or spate.ErrFatal
	fix  string
}

func (f *fileFault) Error() string {
	if f.fix == "" {
		return f.err.Error()
	}
	return f.err.Error() + " (" + f.fix + ")"
}

func (f *fileFault) Unwrap() []error { return []error{f.err, f.kind} }

// markFileFault marks err, an error of the file sink's I/O, with its kind
// (see above).
func markFileFault(err error) error {
	if err == nil || errors.Is(err, spate.ErrRetryable) || errors.Is(err, spate.ErrFatal) ||
		errors.Is(err, spate.ErrFenced) || errors.Is(err, pipeline.ErrOutputDamaged) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EAGAIN, syscall.EINTR, syscall.EBUSY,
		syscall.ETIMEDOUT, syscall.ESTALE, syscall.ENFILE, syscall.EMFILE, syscall.ENOMEM:
		return &fileFault{err: err, kind: spate.ErrRetryable}
	}
	path := "the destination"
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path != "" {
		path = pe.Path
	}
	var fix string
	switch errno {
	case syscall.EACCES, syscall.EPERM:
		fix = "permission denied: give the user the job runs as permission to create, write and remove files under " + path +
			" (and every directory above it), or point the job at a destination it may write; a retry cannot mend it"
	case syscall.EROFS:
		fix = "the filesystem holding " + path + " is read-only: remount it read-write, or point the job at a writable destination; a retry cannot mend it"
	case syscall.ENOTDIR:
		fix = "a part of " + path + " that must be a directory is a file: move that file away, or point the job at another destination; a retry cannot mend it"
	case syscall.EISDIR:
		fix = path + " is a directory where the job writes a file: move it away, or point the job at another destination; a retry cannot mend it"
	case syscall.ENAMETOOLONG:
		fix = path + " is too long a name for its filesystem: point the job at a destination with a shorter path; a retry cannot mend it"
	case syscall.ELOOP:
		fix = path + " passes through a loop of symbolic links: fix the links, or point the job at another destination; a retry cannot mend it"
	default:
		return err
	}
	return &fileFault{err: err, kind: spate.ErrFatal, fix: fix}
}
