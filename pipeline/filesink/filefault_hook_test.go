package filesink

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Each fault of the file sink is marked with its kind: a disk fault that
// passes Retryable, a refusal no retry mends Fatal with the fix and the
// path; anything else, or an error already marked, keeps what it was.
func TestFileSinkFaultsAreMarked(t *testing.T) {
	pe := func(op string, errno syscall.Errno) error {
		return fmt.Errorf("cannot create the staging file /d/.spate/stage/a/1.stage: %w", &os.PathError{Op: op, Path: "/d/.spate/stage/a/1.stage", Err: errno})
	}
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EAGAIN, syscall.EINTR, syscall.ESTALE, syscall.EMFILE} {
		err := markFileFault(pe("write", errno))
		assert.True(t, spate.IsRetryable(err), "%v: not Retryable", errno)
		assert.ErrorIs(t, err, errno, "the cause is kept")
	}
	for errno, fix := range map[syscall.Errno]string{
		syscall.EACCES:  "permission denied: give the user the job runs as permission",
		syscall.EPERM:   "permission denied: give the user the job runs as permission",
		syscall.EROFS:   "is read-only: remount it read-write",
		syscall.ENOTDIR: "that must be a directory is a file",
		syscall.EISDIR:  "is a directory where the job writes a file",
	} {
		err := markFileFault(pe("open", errno))
		assert.True(t, spate.IsFatal(err), "%v: not Fatal", errno)
		assert.ErrorIs(t, err, spate.ErrFatal, "%v: marked Fatal", errno)
		assert.Contains(t, err.Error(), fix, "%v: the fix", errno)
		assert.Contains(t, err.Error(), "/d/.spate/stage/a/1.stage", "%v: the path", errno)
		assert.Contains(t, err.Error(), "a retry cannot mend it")
	}
	for _, err := range []error{
		errors.New("the committed output of split a names another file"),
		fmt.Errorf("%w: gone: %w", pipeline.ErrOutputDamaged, syscall.EIO),
		spate.Fatalf("refused: %w", syscall.ENOSPC),
		pe("open", syscall.ENOENT),
	} {
		assert.Equal(t, err, markFileFault(err), "%v: remarked", err)
	}
	assert.NoError(t, markFileFault(nil))
}
